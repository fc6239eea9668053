"""The model zoo: local store, manifests, remotes, pull and push."""
