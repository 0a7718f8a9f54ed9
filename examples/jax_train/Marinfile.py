"""A tiny JAX training run on CPU that writes a checkpoint, and an eval step that reads it.

Needs the ``jax`` extra: ``pip install 'marinbuild[jax]'`` (from a checkout:
``pip install -e '.[jax]'``). Run it with ``marinbuild run``. Training resumes from its own
checkpoint when it is rerun into the same output directory (a rerun after a failure keeps
the partial output).
"""

import json
import os
from dataclasses import dataclass

from marinbuild import output_path_of, step, this_output_path, versioned


@dataclass(frozen=True)
class DataConfig:
    n: int
    seed: int
    output: str


@dataclass(frozen=True)
class TrainConfig:
    data: str
    steps: int
    learning_rate: float
    output: str
    log_every: int = 50


@dataclass(frozen=True)
class EvalConfig:
    data: str
    checkpoint: str
    output: str


def make_data(config: DataConfig) -> None:
    import numpy as np

    rng = np.random.default_rng(config.seed)
    x = rng.normal(size=(config.n, 3))
    y = x @ np.array([2.0, -1.0, 0.5]) + 0.3 + 0.01 * rng.normal(size=config.n)
    np.savez(os.path.join(config.output, "data.npz"), x=x, y=y)


def train(config: TrainConfig) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    data = np.load(os.path.join(config.data, "data.npz"))
    x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
    ckpt = os.path.join(config.output, "checkpoint.npz")
    if os.path.exists(ckpt):
        saved = np.load(ckpt)
        params, start = {"w": jnp.asarray(saved["w"]), "b": jnp.asarray(saved["b"])}, int(saved["step"])
        print(f"resuming from step {start}")
    else:
        params, start = {"w": jnp.zeros(3), "b": jnp.zeros(())}, 0

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    @jax.jit
    def update(p):
        grads = jax.grad(loss)(p)
        return jax.tree_util.tree_map(lambda a, g: a - config.learning_rate * g, p, grads)

    for i in range(start, config.steps):
        params = update(params)
        if (i + 1) % config.log_every == 0 or i + 1 == config.steps:
            print(f"step {i + 1} loss {float(loss(params)):.6f}")
            tmp = os.path.join(config.output, "checkpoint.tmp.npz")
            np.savez(tmp, w=np.asarray(params["w"]), b=np.asarray(params["b"]), step=i + 1)
            os.replace(tmp, ckpt)


def evaluate(config: EvalConfig) -> None:
    import numpy as np

    data = np.load(os.path.join(config.data, "data.npz"))
    ckpt = np.load(os.path.join(config.checkpoint, "checkpoint.npz"))
    pred = data["x"] @ ckpt["w"] + ckpt["b"]
    mse = float(np.mean((pred - data["y"]) ** 2))
    with open(os.path.join(config.output, "eval.json"), "w") as f:
        json.dump({"mse": mse, "trained_steps": int(ckpt["step"])}, f)
    print(f"mse {mse:.6f}")


data = step("jax/data", make_data, DataConfig(n=versioned(512), seed=versioned(0), output=this_output_path()))
model = step(
    "jax/train",
    train,
    TrainConfig(data=data, steps=versioned(300), learning_rate=versioned(0.1), output=this_output_path()),
)
metrics = step(
    "jax/eval",
    evaluate,
    EvalConfig(data=data, checkpoint=output_path_of(model), output=this_output_path()),
)
