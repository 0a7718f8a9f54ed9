"""A multi-host JAX program for marinbuild's TPU backend: every process meets, all-gathers its id.

marinbuild starts this on every host of the step's slices with ``MARINBUILD_*`` variables
telling each process its place; process 0 writes ``result.json`` to the step's output.
On machines without a TPU set ``JAX_PLATFORMS=cpu`` (the processes then talk over gloo).
"""

from __future__ import annotations

import json
import os


def main() -> None:
    env = os.environ
    num_processes = int(env["MARINBUILD_NUM_PROCESSES"])
    process_id = int(env["MARINBUILD_PROCESS_ID"])

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if env.get("JAX_PLATFORMS") == "cpu":
        # CPU processes need a collectives library to reach each other.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=env["MARINBUILD_COORDINATOR_ADDRESS"],
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=int(env.get("TRAIN_INIT_TIMEOUT", "300")),
    )
    gathered = multihost_utils.process_allgather(np.array([jax.process_index()], dtype=np.int32))
    result = {
        "process_count": jax.process_count(),
        "process_ids": [int(x) for x in np.ravel(gathered)],
        "num_slices": int(env.get("MARINBUILD_NUM_SLICES", "1")),
        "attempt": int(env.get("MARINBUILD_ATTEMPT", "1")),
        "backend": jax.default_backend(),
    }
    print(f"process {process_id}/{num_processes}: gathered {result['process_ids']}", flush=True)
    if process_id == 0:
        out = env["MARINBUILD_OUTPUT"].rstrip("/") + "/result.json"
        import fsspec  # a gs:// output needs gcsfs installed on the hosts

        with fsspec.open(out, "w") as f:
            json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
