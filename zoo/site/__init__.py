"""`zoo site`: a static web catalog of a zoo (local or remote) that works offline and from any file
server or bucket: no CDN, no external URL, relative links only, nothing but files zoo writes.

Modules (one job each): ``sources`` (manifests and small files from the local zoo or a remote
one), ``data`` (what the pages show, as the ``site.json`` document), ``lineage`` (the DAG of the
stages that built a version, read from its zoo.lock / provenance statement, and its SVG),
``layout`` (a layered layout of a DAG), ``plots`` (SVG scatter plots), ``svg`` (escaped SVG and
HTML elements), ``text`` (numbers and sizes as the pages write them), ``card`` (a model card's
markdown as safe HTML), ``render`` (the HTML pages), ``build`` (writing a site folder),
``serve`` (a local HTTP server), ``publish`` (uploading a site next to a remote zoo).

Site layout (``zoo site build -o DIR``)::

    index.html                                   every model, with client-side search and filters
    site.json                                    {"schema_version": 2, ...}: the data the pages came from
    assets/site.css, assets/catalog.js           hand-written, vendored with the site
    models/<name>/<version>/index.html           a version: plots, lineage, builds, card, pull commands
    models/<name>/<version>/files/<path>         its small files (card, zoo.lock, provenance, test
                                                 vectors), never the model weights: `zoo pull` gets builds

Security: a model card, a manifest and every file of a version are untrusted input. Every string
is escaped; a card's raw HTML is shown as text; its links stay only when they point at a file the
site holds; copied files keep types a browser never runs (no HTML, SVG or script); and every page
carries a Content-Security-Policy that allows only the site's own script and style sheet.
"""
