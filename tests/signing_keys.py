"""Key pairs and a small certificate authority for the signing tests, made with `cryptography`
(real keys, real certificates; nothing from the network)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class KeyPair:
    private: Path  # PEM, PKCS#8, unencrypted
    public: Path  # PEM SubjectPublicKeyInfo
    key: ec.EllipticCurvePrivateKey


def make_key(folder: Path, name: str, curve: ec.EllipticCurve | None = None) -> KeyPair:
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(curve or ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return KeyPair(private, public, key)


@dataclass
class Cert:
    path: Path  # PEM
    cert: x509.Certificate
    key: KeyPair


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "zoo tests")])


def make_ca(folder: Path, name: str, issuer: Cert | None = None) -> Cert:
    """A self-signed root CA certificate, or with `issuer` an intermediate CA it issued."""
    key = make_key(folder, name)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(name))
            .issuer_name(issuer.cert.subject if issuer else _name(name))
            .public_key(key.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0 if issuer else 1), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign((issuer.key if issuer else key).key, hashes.SHA256()))
    path = folder / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Cert(path, cert, key)


def make_leaf(folder: Path, name: str, issuer: Cert, email: str = "release@example.com") -> Cert:
    """A code-signing certificate for a new key, issued by `issuer`."""
    key = make_key(folder, name)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(issuer.cert.subject)
            .public_key(key.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=10))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]), critical=False)
            .sign(issuer.key.key, hashes.SHA256()))
    path = folder / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Cert(path, cert, key)
