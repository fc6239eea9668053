"""What the Google Cloud Storage and Azure Blob backends (zoo/storage/backend_gcs.py,
backend_azure.py) add to the contract suites, against fake-gcs-server and azurite on 127.0.0.1
(cloud_servers.py): Azure's URL forms (the account in the host, as adlfs reads them) and a GCS
service-account key file named by an option, which stores the path and never the key.

The store and remote-zoo promises on both are in test_cache_store_contract.py and
test_registry_remote_contract.py."""

from __future__ import annotations

import json
import uuid

import pytest

from zoo.errors import AccessDenied, InvalidInput
from zoo.registry import api
from zoo.storage.backend_azure import AzureBackend, parse_azure_url
from zoo.registry.config import parse_options
from zoo.storage.fsbackend import open_backend
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

ACCOUNT = "devstoreaccount1"  # azurite's account (cloud_servers.AZURITE_ACCOUNT)


# ---- Azure: URL forms ------------------------------------------------------------------------
@pytest.mark.parametrize("url, account, root", [
    ("az://zoo/team/cache", None, "zoo/team/cache"),
    ("abfs://zoo/team/", None, "zoo/team"),
    ("abfss://zoo", None, "zoo"),
    ("abfss://zoo@acct.dfs.core.windows.net/team/cache", "acct", "zoo/team/cache"),
    ("abfs://zoo@acct.blob.core.windows.net/team", "acct", "zoo/team"),
    ("az://zoo@Acct.dfs.core.windows.net", "acct", "zoo"),
    ("abfss://acct.dfs.core.windows.net/zoo/team/cache", "acct", "zoo/team/cache"),
    ("ABFSS://zoo@acct.dfs.core.windows.net/Team%20A/", "acct", "zoo/Team A"),
])
def test_azure_urls_give_the_account_and_the_container_path(url, account, root):
    assert parse_azure_url(url) == (account, root)


@pytest.mark.parametrize("url, message", [
    ("abfss://zoo@example.com/team", "neither a container nor an Azure storage account host"),
    ("abfss://zoo@acct/team", "after the @ comes the storage account's host"),
    ("abfss://acct.dfs.core.windows.net/", "names no Azure container"),
    ("az:///team", "names no Azure container"),
    ("abfss://zoo:hunter2@acct.dfs.core.windows.net/team", "holds no password"),
])
def test_malformed_azure_urls_are_refused_with_the_forms(url, message):
    with pytest.raises(InvalidInput, match=message) as e:
        parse_azure_url(url)
    assert "hunter2" not in str(e.value) + (e.value.hint or "")
    assert "az://container/prefix" in e.value.hint or "credentials come from the environment" in e.value.hint


def test_every_url_form_reaches_the_same_blobs_on_azurite(azure_connection, monkeypatch):
    """Written through ``abfss://container@account.dfs.core.windows.net/prefix``, read back through
    the account-host form and plain ``az://``: one container, one prefix."""
    monkeypatch.setenv("TEST_AZURE_CONNECTION", azure_connection)
    options = {"connection_string_env": "TEST_AZURE_CONNECTION"}
    prefix = uuid.uuid4().hex[:10]
    writer = open_backend(f"abfss://zoo@{ACCOUNT}.dfs.core.windows.net/{prefix}", options)
    assert isinstance(writer, AzureBackend) and writer.root == f"zoo/{prefix}"
    writer.write(writer.path("a", "b.txt"), b"hello")
    assert writer.create(writer.path("entry"), b"first") and not writer.create(writer.path("entry"), b"second")
    for url in (f"abfs://{ACCOUNT}.blob.core.windows.net/zoo/{prefix}", f"az://zoo/{prefix}"):
        reader = open_backend(url, options)
        assert reader.read(reader.path("a", "b.txt")) == b"hello"
        assert reader.read(reader.path("entry")) == b"first"
    from adlfs import AzureBlobFileSystem  # around zoo: where the bytes really are

    assert AzureBlobFileSystem(connection_string=azure_connection).cat_file(f"zoo/{prefix}/a/b.txt") == b"hello"


def test_a_model_pushed_and_pulled_through_an_abfss_remote(azure_connection, monkeypatch, tmp_path):
    monkeypatch.setenv("TEST_AZURE_CONNECTION", azure_connection)
    url = f"abfss://zoo@{ACCOUNT}.dfs.core.windows.net/{uuid.uuid4().hex[:10]}"
    options = {"connection_string_env": "TEST_AZURE_CONNECTION"}
    publisher, consumer = LocalZoo(tmp_path / "publisher"), LocalZoo(tmp_path / "consumer")
    publisher.publish(make_staging(tmp_path / "staging"))
    for zoo in (publisher, consumer):
        api.remote_add("origin", url, options=options, zoo=zoo)
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    pulled = api.pull("tiny@1.0.0", remote="origin", zoo=consumer)
    assert pulled.version == "1.0.0"
    assert consumer.root.joinpath("remotes.json").read_text().count(url) == 1


def test_an_account_in_the_url_must_agree_with_the_credentials(azure_connection, monkeypatch):
    """A connection string for another account would win silently over the URL's account: refused,
    naming both accounts and nothing of the secret; so is a disagreeing account_name option."""
    monkeypatch.setenv("TEST_AZURE_CONNECTION", azure_connection)
    with pytest.raises(InvalidInput, match=f"'otheraccount'.*{ACCOUNT}") as e:
        open_backend("abfss://zoo@otheraccount.dfs.core.windows.net/x", {"connection_string_env": "TEST_AZURE_CONNECTION"})
    assert "AccountKey" not in str(e.value) and "TEST_AZURE_CONNECTION" in str(e.value)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection)  # the default variable too
    with pytest.raises(InvalidInput, match="AZURE_STORAGE_CONNECTION_STRING"):
        open_backend("abfss://otheraccount.dfs.core.windows.net/zoo/x", {})
    with pytest.raises(InvalidInput, match="account_name"):
        open_backend(f"abfss://zoo@{ACCOUNT}.dfs.core.windows.net/x", {"account_name": "otheraccount"})


# ---- GCS: a service-account key file ---------------------------------------------------------
@pytest.fixture
def service_account(tmp_path):
    """A service-account key file whose token endpoint is the stand-in of cloud_servers.py;
    yields (its path, the issuers the endpoint granted tokens to)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from cloud_servers import oauth_token_endpoint

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    email = "zoo-cache@test-project.iam.gserviceaccount.com"
    with oauth_token_endpoint(public, email) as (token_uri, granted):
        path = tmp_path / "sa.json"
        path.write_text(json.dumps({"type": "service_account", "project_id": "test-project", "private_key_id": "k1",
                                    "private_key": private, "client_email": email, "client_id": "1",
                                    "token_uri": token_uri}))
        yield path, granted


def test_a_service_account_key_file_named_by_credentials_file_signs_in(gcs_endpoint, service_account, tmp_path):
    path, granted = service_account
    zoo = LocalZoo(tmp_path / "z")
    url = f"gs://zoo/{uuid.uuid4().hex[:10]}"
    api.remote_add("origin", url, options={"endpoint_url": gcs_endpoint, "credentials_file": str(path)}, zoo=zoo)
    stored = (zoo.root / "remotes.json").read_text()
    assert str(path) in stored and "PRIVATE KEY" not in stored  # the path, never the key
    b = open_backend(url, api.remote_list(zoo=zoo)[0]["options"])
    b.write(b.path("a.txt"), b"signed in")
    assert b.read(b.path("a.txt")) == b"signed in"
    assert granted and set(granted) == {"zoo-cache@test-project.iam.gserviceaccount.com"}


def test_a_credentials_file_that_is_missing_or_no_key_is_access_denied(gcs_endpoint, tmp_path):
    url = f"gs://zoo/{uuid.uuid4().hex[:10]}"
    with pytest.raises(AccessDenied, match="does not exist") as e:
        open_backend(url, {"endpoint_url": gcs_endpoint, "credentials_file": str(tmp_path / "missing.json")})
    assert "credentials_file" in e.value.hint
    (tmp_path / "notes.json").write_text('{"type": "notes"}')
    (tmp_path / "garbage.json").write_text("not json")
    for name in ("notes.json", "garbage.json"):
        with pytest.raises(AccessDenied, match="key file") as e:
            open_backend(url, {"endpoint_url": gcs_endpoint, "credentials_file": str(tmp_path / name)})
        assert "IAM" in e.value.hint
    with pytest.raises(InvalidInput, match="contradict"):
        open_backend(url, {"anon": True, "credentials_file": str(tmp_path / "notes.json")})


def test_options_may_name_where_a_secret_is_but_never_hold_one():
    assert parse_options("gcs", {"credentials_file": "~/keys/sa.json"}) == {"credentials_file": "~/keys/sa.json"}
    for key in ("credentials", "token", "private_key"):
        with pytest.raises(InvalidInput, match="credential|unknown option"):
            parse_options("gcs", {key: "x"})
    with pytest.raises(InvalidInput, match="never stores credentials"):
        parse_options("gcs", {"credentials": "{...}"})
