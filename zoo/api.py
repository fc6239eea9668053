"""The Python API; the CLI only calls these. docs/api.md documents every function with a runnable
example (tests/test_api_docs.py runs them and checks each against its command's `--json`).

- recipes: `run`, `plan`, `status` (a `Result`; `.to_json()` is what the command prints with
  `--json`), `gc`; the remote run cache: `cache_push` / `cache_pull` / `cache_status`;
- the model zoo: `list_models`, `list_versions`, `show`, `search`, `pull`, `push`, `release`:
  each returns exactly what its command prints with `--json` (zoo.registry.api.to_json of the
  same call), and raises the `zoo.errors` class whose exit code the command exits with;
- a build to use: `load_session` (an onnxruntime session), `generate` (a generative build's continuation
  of a prompt, streamed), `load_torch` / `save_torch` (back into torch).

    import zoo.api as zoo
    result = zoo.run("recipes/lenet-digits.yaml", jobs=2)
    for stage in result.stages: print(stage.id, stage.state, [str(r) for r in stage.reasons])
    session = zoo.load_session("lenet-digits@1.0.0")   # an onnxruntime.InferenceSession
    model = zoo.load_torch("lenet-digits@1.0.0")       # a trainable torch.nn.Module

`list_models` is not called `list`: a module-level `list` would shadow the builtin here and in
every `from zoo.api import *`.
"""

from __future__ import annotations

import io
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from zoo import paths
from zoo.engine import lockfile
from zoo.engine.cache import Cache
# the recipe functions live in the engine (zoo/engine/pipeline.py), which release also calls
from zoo.engine.pipeline import Result, load, plan, run, status  # noqa: F401 (part of the API)
from zoo.engine.runner import StageReport, StageState
from zoo.errors import ExitCode, LockOutOfDate, StorageError  # noqa: F401 (part of the API: zoo.api.LockOutOfDate)
from zoo.stage import ReportTable

if TYPE_CHECKING:  # heavy: imported by load_session only
    import onnxruntime


def report_tables(stage: StageReport) -> list[ReportTable]:
    """What the stage's kind reports about this run (the run summary's tables): [] unless it ran."""
    if stage.state != StageState.RAN:
        return []
    from zoo.engine import kind_loader

    return list(kind_loader.get(stage.kind)().report(stage.id, stage.metrics, stage.effects))


def gc(*, cache_dir: str | Path | None = None, keep_recipes: Iterable[str | Path] = (), dry_run: bool = False) -> dict:
    """Free cache space: objects no entry references; with keep_recipes, entries those recipes' locks don't use.
    In the local zoo too: blobs no version references and abandoned partial downloads (result["zoo"]).

    What a live `zoo run` holds is never freed; result["skipped"] counts it. Every keep_recipe
    must exist and have a lockfile (InvalidInput otherwise, before anything is freed): a typo
    must not turn "keep these" into "free everything".
    """
    cache = Cache(paths.cache_dir(cache_dir))
    keep: set[str] | None = None
    recipes = list(keep_recipes)
    if recipes:
        keep = set()
        for r in recipes:
            keep.update(_locked_records(Path(r)))
    result = cache.gc(keep, dry_run=dry_run)
    result["cache_dir"] = str(cache.root)
    from zoo.registry.store import LocalZoo

    local = LocalZoo()
    result["zoo"] = {**local.gc(dry_run=dry_run), "root": str(local.root)}
    return result


def _locked_records(recipe: Path) -> set[str]:
    """The record identities `recipe`'s lockfile holds (`Lock.identities`); InvalidInput for a
    missing recipe or lockfile."""
    from zoo.errors import InvalidInput

    if not recipe.is_file():
        raise InvalidInput(f"--keep {recipe}: " + ("not a recipe file" if recipe.exists() else "no such recipe file"),
                           hint="check the path; nothing was freed (`zoo gc --keep` frees every entry the named "
                                "recipes' lockfiles do not use)")
    lock_file = lockfile.lock_path(recipe.resolve())
    lock = lockfile.read(lock_file)
    if lock is None:
        raise InvalidInput(f"--keep {recipe}: it has no lockfile ({lock_file.name} is missing)",
                           hint=f"run `zoo run {recipe}` first so its lockfile pins what to keep; nothing was freed")
    return lock.identities()


def cache_push(recipes: Iterable[str | Path] = (), *, remote: str | None = None,
               cache_dir: str | Path | None = None, progress: Callable[[int], None] | None = None) -> dict:
    """Push local run-cache entries to the remote run cache: those of `recipes`' stages, or every one.

    `remote`: a URL or a `zoo remote add` name; None takes the configured one (InvalidInput if none).
    Objects go first, each entry last with a create-exclusive write; an entry already there is
    never overwritten (counted in "already"). `progress(n)`: each uploaded object's size."""
    from zoo.engine import cache_sync

    recipes = [Path(r) for r in recipes]
    rc = cache_sync.open_remote(Cache(paths.cache_dir(cache_dir)).ensure(), remote, recipes[0] if recipes else None)
    if rc.setting.unapproved:
        from zoo.errors import InvalidInput

        origin = rc.setting.origin
        raise InvalidInput(f"{origin}: `zoo cache push` pushes only to a remote you chose; this project config "
                           "is not approved", hint=f"read it, then `zoo config allow {origin}`; or pass --remote URL")
    rc.progress = progress
    return cache_sync.push(rc, recipes)


def cache_pull(recipes: Iterable[str | Path], *, remote: str | None = None, cache_dir: str | Path | None = None,
               progress: Callable[[int], None] | None = None) -> dict:
    """Download from the remote run cache the stages of `recipes` that the local cache lacks
    (sha256-verified, resumable; a tampered object is IntegrityError and installs nothing).
    `progress(n)`: each downloaded object's size, once it is verified."""
    from zoo.engine import cache_sync

    recipes = [Path(r) for r in recipes]
    cache = Cache(paths.cache_dir(cache_dir)).ensure()
    rc = cache_sync.open_remote(cache, remote, recipes[0] if recipes else None)
    rc.progress = progress
    with cache.leased():
        return cache_sync.pull(rc, recipes)


def cache_status(recipes: Iterable[str | Path] = (), *, remote: str | None = None,
                 cache_dir: str | Path | None = None) -> dict:
    """Local vs remote run cache: per stage of `recipes`, or entry counts on each side."""
    from zoo.engine import cache_sync

    recipes = [Path(r) for r in recipes]
    rc = cache_sync.open_remote(Cache(paths.cache_dir(cache_dir)), remote, recipes[0] if recipes else None)
    return cache_sync.status(rc, recipes)


# --- the model zoo: each function returns what its command prints with --json -------------------

def list_models(*, remote: str | None = None, zoo: Any = None) -> list[dict[str, Any]]:
    """One row per model, locally or on `remote` (≙ ``zoo list --json``): ``name``, ``latest`` (its
    newest version, or the one `latest` points at), ``versions`` (how many), ``task``,
    ``description``, ``tags`` (tag → version)."""
    from zoo.registry import api as registry

    return registry.to_json(registry.list_models(remote=remote, zoo=zoo))


def list_versions(name: str | None = None, *, remote: str | None = None, zoo: Any = None) -> list[dict[str, Any]]:
    """One row per version (of model `name`, or of every model), newest first per model
    (≙ ``zoo list NAME --json``, ``zoo list --versions --json``): ``name``, ``version``, ``created``,
    ``task``, ``description``, ``license``, ``builds`` (names), ``tags``."""
    from zoo.registry import api as registry

    return registry.to_json(registry.list_versions(name, remote=remote, zoo=zoo))


def show(ref: str, *, remote: str | None = None, zoo: Any = None) -> dict[str, Any]:
    """The manifest of `ref` (``name``, ``name@version``, ``name@tag``) as JSON, plus ``tags`` (those
    pointing at it), ``source`` (``"local"`` or the remote) and ``downloaded`` (build → whether its
    files are in the local zoo) (≙ ``zoo show REF --json``)."""
    from zoo.registry import api as registry

    return registry.to_json(registry.show(ref, remote=remote, zoo=zoo))


def search(text: str = "", *, task: str | None = None, tag: str | None = None, max_latency: float | None = None,
           min_accuracy: float | None = None, all_versions: bool = False, remote: str | None = None,
           zoo: Any = None) -> list[dict[str, Any]]:
    """Builds matching `text` (in name, description or task) and every filter, locally or on `remote`
    (≙ ``zoo search TEXT … --json``): one row per build, ``name``, ``version``, ``task``,
    ``description``, ``build``, ``latency_p50_ms``, ``accuracy``, ``passed``; by name, newest
    version first, then build. Only each model's newest version unless `all_versions`."""
    from zoo.registry import api as registry

    return registry.to_json(registry.search(text, task=task, tag=tag, max_latency=max_latency,
                                            min_accuracy=min_accuracy, all_versions=all_versions, remote=remote,
                                            zoo=zoo))


def pull(ref: str, build: str | None = None, *, to: str | Path | None = None, remote: str | None = None,
         offline: bool = False, require_signature: bool = False, zoo: Any = None) -> dict[str, Any]:
    """Download (every file checked against its sha256) and place a build of `ref`
    (≙ ``zoo pull REF [--build B] --json``): ``name``, ``version``, ``ref``, ``build``, ``path``
    (its model file), ``source`` (where the manifest came from), ``downloaded_files``,
    ``downloaded_bytes``, ``fetched_from``, ``notes``, ``signature`` (the signature check, None
    when none was made). `build` defaults to the best one this host can run
    (zoo/registry/select.py); `require_signature` refuses a version that is not signed by a key
    you trust (SignatureError, exit 4; docs/releases.md)."""
    from zoo.registry import api as registry

    return registry.to_json(registry.pull(ref, build=build, to=to, remote=remote, offline=offline, zoo=zoo,
                                          require_signature=require_signature))


def verify(ref: str, *, require_signature: bool = False, zoo: Any = None) -> dict[str, Any]:
    """Check a version of the local zoo (≙ ``zoo verify NAME@VERSION --json``): its signature
    against the keys you trust (``signature``), every attachment covered, every stored file's bytes
    against its sha256 (``files``: path -> ok / missing / corrupt). `ok` is True when nothing was
    refused; a refusal raises SignatureError or IntegrityError (exit 4)."""
    from zoo.registry import api as registry

    return registry.to_json(registry.verify(ref, require_signature=require_signature, zoo=zoo))


def push(ref: str, to: str, *, tags: Iterable[str] = (), zoo: Any = None,
         progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Publish local ``name@version`` to remote `to`, blobs first, the manifest last and
    create-exclusive, and point `tags` at it there (≙ ``zoo push REF --to REMOTE --json``):
    ``remote``, ``ref``, ``created`` (False: the same bytes were there), ``uploaded``,
    ``skipped``, ``bytes``. `progress(n)`: called with each uploaded file's size once it is up."""
    from zoo.registry import api as registry

    return registry.to_json(registry.push(ref, to, tags=list(tags), zoo=zoo, progress=progress))


def release(recipe: str | Path, *, version: str, to: str, tags: Iterable[str] = (), allow_stale_lock: bool = False,
            cache_dir: str | Path | None = None, jobs: int = 1, sign: str | Path | None = None,
            certificate: str | Path | None = None, certificate_chain: Iterable[str | Path] = (),
            zoo: Any = None) -> dict[str, Any]:
    """Run `recipe` under its lockfile, check its gates, sign the version (`sign`: a PEM EC private
    key, with its `certificate` and `certificate_chain`; else ``signing.key`` of the user's config),
    publish ``name@version`` to remote `to` and tag it (zoo/release/ship.py) (≙ ``zoo release
    RECIPE --version V --to REMOTE [--sign KEY] --json``): ``ref``, ``created``, ``noop``,
    ``executed``/``cached`` (stage ids), ``lock_changed``, ``uploaded``/``skipped``/``bytes``,
    ``builds`` and ``files`` (→ sha256), ``gates``, ``notes``, ``signature``…"""
    from zoo.release.ship import release as ship

    signer = None
    if sign is not None:
        from zoo.registry.signing import Signer

        signer = Signer(Path(sign).expanduser().resolve(),
                        Path(certificate).expanduser().resolve() if certificate is not None else None,
                        tuple(Path(c).expanduser().resolve() for c in certificate_chain))
    return ship(recipe, version=version, to=to, tags=tags, allow_stale_lock=allow_stale_lock, cache_dir=cache_dir,
                jobs=jobs, zoo=zoo, sign=signer).to_json()


def load_session(ref: str, build: str | None = None, providers: Sequence[str] | None = None, *,
                 session_options: onnxruntime.SessionOptions | None = None, remote: str | None = None,
                 offline: bool = False, zoo: Any = None) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` on a build of `ref`, pulled first (≙ ``zoo pull REF
    [--build B]``, then ``onnxruntime.InferenceSession(path)``): every file is checked against its
    sha256 before onnxruntime reads it (IntegrityError otherwise).

    `build` defaults to the best build onnxruntime can run here (`zoo pull`'s rule among the
    ``onnx`` and ``ort`` formats: an OpenVINO build is never the default here, even where
    `zoo pull` would pick it). An OpenVINO build (format ``openvino``) is InvalidInput: it is
    OpenVINO IR, not a model onnxruntime reads (pull it and compile it with ``openvino``).
    `providers` default to the build's execution providers that onnxruntime offers here, else
    CPU; one it does not offer here is InvalidInput (onnxruntime itself would fall back to CPU).
    Each provider is created with the build's ``provider_options`` (a TensorRT build's precision
    and engine cache: the engine is kept in the local zoo's ``engines/``, built once per model and GPU).
    A model onnxruntime refuses is InvalidInput.
    """
    from zoo.registry.store import LocalZoo

    local = zoo or LocalZoo()
    manifest = _resolve(ref, remote, offline, local)
    chosen = _onnxruntime_build(manifest, build, providers, local)
    return _session_on(manifest, chosen, providers, session_options, remote, offline, zoo, local)[0]


def _onnxruntime_build(manifest: Any, build: str | None, providers: Sequence[str] | None, local: Any) -> Any:
    """`build` of `manifest`, or by default the best one onnxruntime runs here (`zoo pull`'s rule
    among the ``onnx`` and ``ort`` formats); an OpenVINO build is InvalidInput."""
    from zoo.errors import InvalidInput
    from zoo.registry import select

    if build is None:
        host = select.host_runtimes(list(providers) if providers is not None else None)
        onnxruntime_only = select.HostRuntimes({k: v for k, v in host.versions.items() if k == "onnxruntime"},
                                               host.providers)
        chosen = select.best_build(manifest, host=onnxruntime_only)
    else:
        chosen = local.get_build(manifest, build)
    if chosen.format == "openvino":
        raise InvalidInput(f"{manifest.ref} build {chosen.name} is an OpenVINO build (IR): onnxruntime cannot load it",
                           hint=f"load one of the builds onnxruntime reads ("
                                f"{', '.join(n for n, b in sorted(manifest.builds.items()) if b.format != 'openvino')}), "
                                "or pull this one "
                                f"(zoo.pull({manifest.ref!r}, {chosen.name!r})) and compile its .xml with "
                                "openvino.Core().compile_model")
    return chosen


def _session_on(manifest: Any, chosen: Any, providers: Sequence[str] | None, session_options: Any, remote: str | None,
                offline: bool, zoo: Any, local: Any) -> tuple[Any, Any]:
    """Pull `chosen` (every file checked against its sha256) and open an onnxruntime session on it
    with the build's providers and their options: (the session, the pull's result)."""
    import onnxruntime

    from zoo.errors import InvalidInput
    from zoo.registry import api as registry

    offered = set(onnxruntime.get_available_providers())
    if providers is None:
        providers = [p for p in chosen.execution_providers if p in offered] or ["CPUExecutionProvider"]
    missing = [p for p in providers if p not in offered]
    if missing:  # onnxruntime would fall back to CPU with a printed warning: a caller who asked for CUDA must know
        raise InvalidInput(f"onnxruntime offers no {', '.join(missing)} here (asked for {manifest.ref} build "
                           f"{chosen.name})", hint=f"providers offered here: {', '.join(sorted(offered))}")
    pulled = registry.pull(manifest.ref, build=chosen.name, remote=remote, offline=offline, zoo=zoo)
    try:
        session = onnxruntime.InferenceSession(pulled.path, sess_options=session_options, providers=list(providers),
                                               provider_options=[_provider_options(chosen, p, local.root)
                                                                 for p in providers])
    except Exception as e:  # onnxruntime raises Fail/InvalidGraph/NoSuchFile/... from C++: all mean "cannot load"
        raise InvalidInput(f"onnxruntime cannot load {manifest.ref} build {chosen.name} ({pulled.path}): {e}",
                           hint=f"the build needs {chosen.runtime or 'onnxruntime'}; onnxruntime "
                                f"{onnxruntime.__version__} is installed here, with {', '.join(providers)}") from e
    return session, pulled


GENERATION_FILES = ("genai_config.json", "tokenizer.json")  # what `generate` reads beside a build's model file


def generate(ref: str, prompt: str, *, build: str | None = None, max_new_tokens: int = 64, sample: bool = False,
             temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, threads: int | None = None, remote: str | None = None, offline: bool = False,
             zoo: Any = None, on_text: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A continuation of `prompt` by a generative build of `ref` (≙ ``zoo generate REF PROMPT --json``).

    The build is the one `load_session` would open (`zoo pull`'s choice among the builds
    onnxruntime runs), or `build`; it is pulled first, every file checked against its sha256, and
    must be a decoder with a KV cache (onnxruntime-genai's convention) shipping genai_config.json
    and tokenizer.json beside its model file (InvalidInput otherwise; `tokenizers`, the ``text``
    extra, is MissingExtra when absent). The prompt is tokenized with the build's tokenizer.json
    (read as data: nothing in a build runs), then `zoo.textgen` decodes greedily, or with `sample`
    draws with `temperature` (default 1.0), `top_k`, `top_p` (default 1.0) from a generator seeded
    with `seed` (default 0: the same seed, the same text), until `max_new_tokens` or the build's
    end-of-sequence token. `on_text(piece)` gets the text as it comes (``zoo generate`` prints it);
    `threads`: onnxruntime's intra-op threads (default: onnxruntime's own choice).

    Returns ``ref``, ``build``, ``prompt``, ``text`` (the continuation, special tokens left out),
    ``prompt_tokens`` and ``tokens`` (ids), ``new_tokens``, ``finish_reason`` (``"eos"`` or
    ``"length"``), ``prefill_ms``, ``decode_tokens_per_s`` (null with fewer than two new tokens),
    ``sampling`` (null when greedy, else its settings)."""
    import onnxruntime

    from zoo import decoder_io, textgen, tokenizer_file
    from zoo.errors import InvalidInput
    from zoo.registry.store import LocalZoo

    if not sample and (temperature, top_k, top_p, seed) != (None, None, None, None):
        raise InvalidInput("temperature, top_k, top_p and seed apply to sampling only",
                           hint="add --sample (sample=True), or leave them out for greedy decoding")
    sampling = textgen.Sampling(temperature=1.0 if temperature is None else temperature, top_k=top_k,
                                top_p=1.0 if top_p is None else top_p, seed=0 if seed is None else seed) \
        if sample else None
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InvalidInput(f"max_new_tokens must be a positive integer (got {max_new_tokens!r})")
    tokenizer_file.require_tokenizers()  # before any download: a missing extra is said first
    local = zoo or LocalZoo()
    manifest = _resolve(ref, remote, offline, local)
    chosen = _onnxruntime_build(manifest, build, None, local)
    where = f"{manifest.ref} build {chosen.name}"
    names = [p.name for p in chosen.inputs]
    if names and not decoder_io.is_decoder(names):
        raise InvalidInput(f"{where} is not a generative model (its inputs: {', '.join(names)})",
                           hint="zoo generate runs decoder builds with a KV cache (task text-generation)")
    folder = PurePosixPath(chosen.file.path).parent
    shipped = {f.path for f in chosen.all_files()}
    lacking = [n for n in GENERATION_FILES if str(folder / n) not in shipped]
    if lacking:
        raise InvalidInput(f"{where} ships no {' or '.join(lacking)} beside its model file {chosen.file.path}",
                           hint="a generative build ships genai_config.json and the tokenizer files beside "
                                "model.onnx (task text-generation)")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: the CLI's stdout and stderr are the user's
    if threads is not None:
        if threads < 1:
            raise InvalidInput(f"threads must be at least 1 (got {threads})")
        options.intra_op_num_threads = threads
    session, pulled = _session_on(manifest, chosen, None, options, remote, offline, zoo, local)
    model_dir = Path(pulled.path).parent
    try:
        decoder = textgen.Decoder.from_folder(session, model_dir)
    except InvalidInput as e:
        raise InvalidInput(f"{where}: {e.message}", hint=e.hint) from None
    tokenizer = tokenizer_file.load_tokenizer(model_dir / "tokenizer.json")
    ids = tokenizer_file.encode(tokenizer, prompt)
    if sampling is None:
        generation = decoder.greedy(ids, max_new_tokens)
    else:
        generation = decoder.sample(ids, max_new_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                                    top_p=sampling.top_p, seed=sampling.seed)
    stream = tokenizer_file.TextStream(tokenizer, ids)
    for token in generation:  # streamed: each piece is given out as its token comes
        piece = stream.step(token)
        if piece and on_text is not None:
            on_text(piece)
    rest = stream.finish()
    if rest and on_text is not None:
        on_text(rest)
    rate = generation.decode_tokens_per_s
    return {"ref": manifest.ref, "build": chosen.name, "prompt": prompt, "text": stream.text(),
            "prompt_tokens": ids, "tokens": generation.tokens, "new_tokens": len(generation.tokens),
            "finish_reason": "eos" if generation.stopped_by_eos else "length",
            "prefill_ms": generation.prefill_s * 1000.0, "decode_tokens_per_s": rate,
            "sampling": None if sampling is None else {"temperature": sampling.temperature, "top_k": sampling.top_k,
                                                       "top_p": sampling.top_p, "seed": sampling.seed}}


def _provider_options(build: Any, provider: str, zoo_root: Path) -> dict[str, str]:
    """The build's options for `provider` (a TensorRT build's precision and engine cache), a
    relative cache folder placed in the local zoo's ``engines/``, one per model file (an engine is
    made for one model, GPU and TensorRT version; the provider names its files by the last two)."""
    options = dict(build.provider_options.get(provider, {}))
    for key in ("trt_engine_cache_path", "trt_timing_cache_path"):
        if key in options and not Path(options[key]).is_absolute():
            options[key] = str(zoo_root / "engines" / build.file.sha256[:16] / options[key])
    return options


def load_torch(ref: str, build: str | None = None, *, remote: str | None = None, offline: bool = False,
               zoo: Any = None) -> Any:
    """The build of `ref` (``name[@version|@tag]``) as a trainable ``torch.nn.Module`` (eval mode)
    whose outputs match the ONNX build's (`zoo.onnx_to_torch`; torch is imported now).

    The build is pulled first (every file checked against its sha256; nothing in it is run) and
    then rebuilt op by op: weights become parameters (as tensors: no pickled code), named as the
    exporting torch model named them. `build` defaults to the version's float32 ONNX build. An
    int8 (QDQ) build gives float32 weights dequantized from its int8 ones, with its activation
    quantization kept as fake-quantize steps (straight-through gradients), so it computes what the
    int8 build computes; MatMulNBits weights (``linear: blockwise``) become float32 ``nn.Linear``
    weights and dynamic int8 (MatMulInteger) is computed in float32. A quantized build's module
    lists what was dequantized in ``module.dequantized`` ([] for a float build), and loading one
    logs it (one warning line of the ``zoo`` logger); an op the converter cannot handle is InvalidInput naming the float32 build
    to load instead. An ORT-format build (``mobile``) is InvalidInput. ``module.input_names``
    and ``module.output_names`` are the graph's.
    """
    pulled = _pull_float(ref, build, remote, offline, zoo)
    return _convert_build(pulled, zoo)


def _convert_build(pulled: Any, zoo: Any) -> Any:
    """`onnx_to_torch.convert` of a pulled build; a quantized build's dequantization is logged (a
    warning of the ``zoo`` logger), and an op it cannot convert names the float32 build to load instead."""
    import logging

    from zoo import onnx_to_torch
    from zoo.errors import InvalidInput

    where = f"{pulled.ref} build {pulled.build}"
    try:
        module = onnx_to_torch.convert(Path(pulled.path), where=where)
    except InvalidInput as e:
        fp32 = _float_build_name(pulled.ref, zoo)
        if fp32 is None or fp32 == pulled.build:
            raise
        raise InvalidInput(e.message, hint=f"load the float32 build instead: zoo.load_torch({pulled.ref!r}, "
                                           f"build={fp32!r}) (`zoo pull {pulled.ref} --as torch --build {fp32}`)") from None
    if module.dequantized:  # one line, on the CLI as in a Python session (logging's last-resort handler)
        logging.getLogger("zoo").warning("%s is quantized; the torch module holds its weights dequantized: %s",
                                         where, "; ".join(module.dequantized))
    return module


def _float_build_name(ref: str, zoo: Any) -> str | None:
    """The version's float32 ONNX build, or None when it has none."""
    from zoo.registry.select import float_build
    from zoo.registry.store import LocalZoo

    from zoo.errors import ZooError

    try:
        return float_build((zoo or LocalZoo()).resolve(ref)).name
    except ZooError:  # no float build (NotFound): the converter's error stands as it is
        return None


def save_torch(ref: str, build: str | None = None, *, to: str | Path | None = None, remote: str | None = None,
               offline: bool = False, zoo: Any = None) -> Path:
    """Write `load_torch`'s module as a ``torch.export`` program (``.pt2``) and return its path:
    ``torch.export.load(path).module()`` gives the module back, without zoo, its named dimensions
    (the batch) kept dynamic. `to`: a folder (the file is ``model.pt2`` in it) or a ``.pt2`` path;
    default ``./NAME-VERSION-BUILD.pt2``."""
    import torch

    from zoo.files import atomic_write
    from zoo.registry.store import LocalZoo

    pulled = _pull_float(ref, build, remote, offline, zoo)
    module = _convert_build(pulled, zoo)
    ports = (zoo or LocalZoo()).resolve(pulled.ref).builds[pulled.build].inputs
    examples, dims = [], []
    for port in ports:
        shape = [2 if not isinstance(d, int) else d for d in port.shape]
        examples.append(torch.zeros(shape, dtype=getattr(torch, port.dtype)))
        dims.append({i: torch.export.Dim.AUTO for i, d in enumerate(port.shape) if not isinstance(d, int)})
    target = Path(to) if to else Path.cwd() / f"{pulled.name}-{pulled.version}-{pulled.build}.pt2"
    if target.suffix != ".pt2":
        target.mkdir(parents=True, exist_ok=True)
        target = target / "model.pt2"
    program = torch.export.export(module, tuple(examples), dynamic_shapes=(tuple(dims),))
    buffer = io.BytesIO()  # torch.export.save wants a .pt2 name or a buffer, not a temp file's name
    torch.export.save(program, buffer)
    atomic_write(target, buffer.getvalue())
    return target


def _resolve(ref: str, remote: str | None, offline: bool, zoo: Any):
    """The manifest `ref` names: local first, then the remotes (`zoo pull`'s order; nothing is adopted)."""
    from zoo.registry.pull import candidate_remotes, resolve_manifest
    from zoo.registry.refs import parse_ref

    remotes = [] if offline else candidate_remotes(zoo, remote)
    return resolve_manifest(zoo, parse_ref(ref), remotes, offline, [])[0]


def _pull_float(ref: str, build: str | None, remote: str | None, offline: bool, zoo: Any):
    """Pull `build` of `ref`, by default the version's float32 ONNX build (`select.float_build`)."""
    from zoo.registry import api as registry
    from zoo.registry.select import float_build
    from zoo.registry.store import LocalZoo

    if build is None:
        manifest = _resolve(ref, remote, offline, zoo or LocalZoo())
        ref, build = manifest.ref, float_build(manifest).name
    return registry.pull(ref, build=build, remote=remote, offline=offline, zoo=zoo)
