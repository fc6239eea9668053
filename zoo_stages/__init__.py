"""Built-in stage kinds of zoo, installed as the package `zoo_stages` (one module per kind)."""
