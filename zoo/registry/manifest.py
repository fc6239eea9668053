"""The manifest format, under the name the registry's modules use for it.

The format belongs to the engine and the kind interface (zoo/manifest.py: a kind writes a release
folder with it, the engine publishes the folder); the registry stores, serves and checks it. The
names are the same objects, so a manifest read here is a `zoo.manifest.Manifest`.
"""

from zoo.manifest import (BUILD_RE, MANIFEST_FILE, MANIFEST_SCHEMA_VERSION, MAX_FIGURE, MAX_INT, MAX_NESTING, NAME_RE,
                          READABLE_SCHEMA_VERSIONS, VERSION_RE, Bounded, Build, FileRef, Lineage, Manifest, Port,
                          check_bounded, describe_measured_on, GENERATION_METRICS, generation_figures)

__all__ = ["BUILD_RE", "MANIFEST_FILE", "MANIFEST_SCHEMA_VERSION", "MAX_FIGURE", "MAX_INT", "MAX_NESTING", "NAME_RE",
           "READABLE_SCHEMA_VERSIONS", "VERSION_RE", "Bounded", "Build", "FileRef", "Lineage", "Manifest", "Port",
           "check_bounded", "describe_measured_on", "GENERATION_METRICS", "generation_figures"]
