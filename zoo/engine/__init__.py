"""The pipeline engine: recipe → DAG → keys → run → cache → lockfile.

``recipe`` and ``yamlpos`` (the format, errors with positions), ``planner`` (the DAG),
``kind_loader`` (stage kinds from entry points), ``keys`` and ``import_closure`` (cache keys and
the code in them), ``explain`` (why a stage reruns), ``runner``, ``executors`` and ``worker``
(scheduling, where stages run, what runs inside a worker), ``cache``, ``hashing`` and ``leases``
(the run cache), ``lockfile`` and ``frozen`` (the lock a run writes and `--frozen`),
``fastpath`` (the no-op rerun answered from a stamp). The kind contract is `zoo.stage`; the
Python API over all this is `zoo.api`.
"""
