"""The Keras MLP of recipes/keras-mlp-breast-cancer.yaml: zoo calls `train` as the train stage's
`config.entry` (the contract: zoo_stages/lib/entry_models/__init__.py, the README's "Keras and JAX
models") and saves the Keras model it returns; export converts that checkpoint."""

import keras


def train(train, val, config, context):
    """Build, compile and fit the MLP on the training split; return the trained keras.Model."""
    x, y = train
    model = keras.Sequential([
        keras.Input(shape=(x.shape[1],), name="features"),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(2, activation="softmax"),  # the deployed model gives probabilities
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=config["optimizer"]["lr"]),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=config["epochs"], batch_size=config["batch_size"], shuffle=True,
                        validation_data=tuple(val), verbose=0)
    context.metrics["keras_val_accuracy"] = round(float(history.history["val_accuracy"][-1]), 6)
    return model
