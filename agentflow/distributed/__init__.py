"""agentflow beyond one machine, on Ray (optional extra ``agentflow[ray]``).

- ``placement``: the cluster-file option ``placement: ray`` and how an instance entry maps to
  Ray resources (GPUs = tensor-parallel size, ``accelerator_type:<GPU>``). Ray-free.
- ``actor``: what runs inside each instance's Ray actor (its backend, built on its node).
- ``ray_backend``: the coordinator's side — an ``LLMBackend`` that reaches an actor, and the
  start-up of all of a config's actors.
- ``grid``: a map of independent cells (simulations) run serially or as Ray tasks.

Only the modules that need Ray import it, and only when used, so the default install and
the default test suite stay Ray-free.
"""

from __future__ import annotations


def require_ray():
    """Import Ray or raise ``ImportError`` saying how to get it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError("Ray is not installed: pip install 'agentflow[ray]' (on every node "
                          "of the cluster, the same agentflow version)") from err
    return ray


def connect_ray(address: str, *, namespace: str | None = None,
                runtime_env: dict | None = None):
    """Join the cluster at ``address`` (``auto``, ``HOST:6379``, ``ray://HOST:10001``) or, for
    ``local``, start a private Ray on this machine; a connection this process already has is
    reused (tests and notebooks start their own)."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    kwargs: dict = {"log_to_driver": False}
    if namespace:
        kwargs["namespace"] = namespace
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    if address == "local":
        ray.init(include_dashboard=False, **kwargs)
    else:
        ray.init(address=address, **kwargs)
    return ray
