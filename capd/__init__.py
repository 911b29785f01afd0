"""capd, a capability sidecar for AI-agent tooling.

Three packages under one name: :mod:`capd.registry` (the model and the build),
:mod:`capd.recovery` (re-probes, the durable retry queue, the sweep) and
:mod:`capd.sidecar` (the daemon in ``server/``, the CLI and MCP bridge in
``client/``). In the repository they are the top-level folders ``registry/``,
``recovery/`` and ``sidecar/``; the package mapping in pyproject.toml installs
them here (and ``capd/`` links to them so tools reading the tree see one name).
"""
