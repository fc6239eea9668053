"""The Flax MLP of recipes/jax-mlp-breast-cancer.yaml (the contract: zoo_stages/lib/entry_models/__init__.py,
the README's "Keras and JAX models"):

- `apply(params, features)`, the recipe's `model.entry`: the forward function that train, export
  (jax2onnx traces it) and the parity gate run; it gives class probabilities;
- `train(apply, train, val, config, context)`, the train stage's `config.entry`: fits the
  parameters with optax's Adam, seeded from `config["seed"]`, and returns them (Flax's variables,
  a nested dict of arrays that zoo saves as safetensors).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


class MLP(nn.Module):
    hidden: tuple[int, ...] = (32, 16)
    classes: int = 2

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.classes)(x)  # logits


def apply(params, features):
    """Class probabilities of the (samples, 30) features."""
    return jax.nn.softmax(MLP().apply(params, features))


def train(apply, train, val, config, context):
    """Adam on the cross-entropy of the logits, seeded batches; returns the trained variables."""
    x, y = train
    init_key, order_key = jax.random.split(jax.random.PRNGKey(config["seed"]))
    params = MLP().init(init_key, jnp.asarray(x[:1]))
    optimizer = optax.adam(config["optimizer"]["lr"])
    state = optimizer.init(params)

    def loss_fn(p, xb, yb):
        return optax.softmax_cross_entropy_with_integer_labels(MLP().apply(p, xb), yb).mean()

    @jax.jit
    def step(p, s, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    n, batch = len(y), config["batch_size"]
    for _ in range(config["epochs"]):
        order_key, key = jax.random.split(order_key)
        order = np.asarray(jax.random.permutation(key, n))
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            params, state, loss = step(params, state, x[idx], y[idx])
    context.metrics["final_batch_loss"] = round(float(loss), 6)
    return params
