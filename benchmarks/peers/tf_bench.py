#!/usr/bin/env python3
"""TensorFlow (Keras) beside lockstep's benchmarks. One measurement per run:

  tf_bench.py step --config S|M|L|cnn [--precision fp32|bf16] [--repeats N]
                                                      one device, one thread: compiled train step
                                                      (bf16: Keras's mixed_bfloat16 policy)
  tf_bench.py mirrored --replicas 1|2 [--repeats N]   config M at global batch 256 fed by tf.data,
                                                      MirroredStrategy over 2 logical CPU devices
  tf_bench.py mainjob --mode one|mirrored [--epochs E] [--model mlp|cnn]
                                                      the Fashion-MNIST main job with Keras fit
                                                      (cnn: fashion_mnist --model cnn's network)
  tf_bench.py pipeline [--epochs E]                   tf.data decode -> shuffle -> batch alone

Threads: one per replica (intra-op 1; inter-op = replicas), except the main job on one device,
which gets the machine's 2 threads (intra-op 2, inter-op 2).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

what = sys.argv[1] if len(sys.argv) > 1 else ""
replicas = int(common.arg("replicas", "2" if common.arg("mode") == "mirrored" else "1"))
threads = 2 if (what == "mainjob" and common.arg("mode") == "one") else 1
common.limit_threads(threads)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(max(threads, replicas))
keras = tf.keras
if replicas > 1 or what == "mainjob" and common.arg("mode") == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
VERSION = f"tensorflow-{tf.__version__}/keras-{keras.__version__}"


def dense_stack(widths, dropout=0.0):
    layers = [keras.Input(shape=(widths[0],))]
    for i, w in enumerate(widths[1:]):
        last = i == len(widths) - 2
        layers.append(keras.layers.Dense(w, activation=None if last else "relu"))
        if dropout and not last:
            layers.append(keras.layers.Dropout(dropout))
    return keras.Sequential(layers)


def cnn():
    """examples/fashion_mnist --model cnn: TensorFlow's layers-tutorial CNN (NHWC)."""
    L = keras.layers
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        L.Conv2D(32, 5, padding="same", activation="relu"), L.MaxPooling2D(2),
        L.Conv2D(64, 5, padding="same", activation="relu"), L.MaxPooling2D(2),
        L.Flatten(), L.Dense(1024, activation="relu"), L.Dropout(0.4), L.Dense(10)])


def step_bench():
    config = common.arg("config", "M")
    repeats = int(common.arg("repeats", "10"))
    precision = common.arg("precision", "fp32")
    if precision == "bf16":  # bf16 compute, fp32 variables; the logits are cast to fp32 for the loss
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    rng = np.random.default_rng(7)
    if config == "cnn":
        batch, model, opt = 64, cnn(), keras.optimizers.Adam(1e-3)
        x = tf.constant(rng.random((batch, 28, 28, 1), dtype=np.float32))
        classes = 10
    else:
        widths, batch = common.STEP_CONFIGS[config]
        model, opt = dense_stack(widths), keras.optimizers.SGD(1e-4)
        x = tf.constant(rng.random((batch, widths[0]), dtype=np.float32))
        classes = widths[-1]
    y = tf.constant(rng.integers(0, classes, batch))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    step(); step()
    # Calls per repeat: about 0.05-0.5 s each, as bench_step's short repeats.
    calls = {"S": 20, "M": 2, "L": 1, "cnn": 1}[config]
    rate = common.best_rate(lambda: step().numpy(), batch, repeats, calls)
    common.result(peer="tensorflow", bench="step", config=config, batch=batch, samples_per_s=f"{rate:.1f}",
                  threads=1, precision=precision, version=VERSION)


UNROLL = 4


def mirrored_bench():
    repeats = int(common.arg("repeats", "8"))
    steps = int(common.arg("steps", "40"))
    batch = 256
    widths = common.STEP_CONFIGS["M"][0]
    rng = np.random.default_rng(7)
    x = rng.random((batch, 784), dtype=np.float32)
    y = rng.integers(0, 10, batch)
    devices = [f"/cpu:{i}" for i in range(replicas)]
    strategy = tf.distribute.MirroredStrategy(devices) if replicas > 1 else tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = dense_stack(widths)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        opt.build(model.trainable_variables)  # its variables exist before the compiled step
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    it = iter(strategy.experimental_distribute_dataset(ds))

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)), global_batch_size=batch)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def train():
        # A few steps unrolled in one call, so that Python's per-call overhead is spread out.
        for _ in range(UNROLL):
            strategy.run(replica_step, args=next(it))

    train()
    rate = common.best_rate(train, batch * UNROLL, repeats, max(1, steps // UNROLL))
    common.result(peer="tensorflow", bench="mirrored", config="M", replicas=replicas, batch=batch,
                  samples_per_s=f"{rate:.1f}", strategy=type(strategy).__name__, version=VERSION)


def mainjob():
    mode = common.arg("mode", "one")
    epochs = int(common.arg("epochs", "20"))
    model_name = common.arg("model", "mlp")
    if model_name not in ("mlp", "cnn"):
        sys.exit(f"tf_bench.py mainjob: --model must be mlp or cnn, got {model_name!r}")
    shape = (28, 28, 1) if model_name == "cnn" else (784,)
    batch, lr, wd, seed = 128, 1e-3, 0.02, 42
    t0 = time.perf_counter()
    keras.utils.set_random_seed(seed)
    train_x, train_y = common.read_idx("train")
    test_x, test_y = common.read_idx("t10k")

    def scale(xb, yb):
        return tf.reshape(tf.cast(xb, tf.float32) * (1.0 / 255), (-1,) + shape), yb

    train = (tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(60000, seed=seed)
             .batch(batch).map(scale).prefetch(tf.data.AUTOTUNE))
    test = tf.data.Dataset.from_tensor_slices((test_x, test_y)).batch(1000).map(scale)
    steps = epochs * ((60000 + batch - 1) // batch)
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if mode == "mirrored"
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = cnn() if model_name == "cnn" else dense_stack([784, 512, 256, 10], dropout=0.2)
        opt = keras.optimizers.AdamW(learning_rate=keras.optimizers.schedules.CosineDecay(lr, steps),
                                     weight_decay=wd, epsilon=1e-8)
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(train, epochs=epochs, verbose=0)
    _, acc = model.evaluate(test, verbose=0)
    wall = time.perf_counter() - t0
    common.result(peer="tensorflow", bench="mainjob", mode=mode, model=model_name, epochs=epochs,
                  wall_s=f"{wall:.1f}", test_accuracy=f"{acc:.4f}", threads=2, version=VERSION)


def pipeline():
    epochs = int(common.arg("epochs", "5"))
    images, labels = common.read_idx("train")  # decoded once, not timed (as bench_pipeline)

    def scale(xb, yb):
        return tf.cast(xb, tf.float32) * (1.0 / 255), yb

    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 2
    ds = (tf.data.Dataset.from_tensor_slices((images, labels.astype(np.int32))).shuffle(60000, seed=7)
          .batch(256).map(scale, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2).with_options(opts))

    @tf.function
    def consume():
        # Every batch reaches the consumer; it reads one feature and one label of each.
        return ds.reduce((tf.constant(0, tf.int64), tf.constant(0.0)),
                         lambda acc, b: (acc[0] + tf.cast(tf.shape(b[0])[0], tf.int64),
                                         acc[1] + b[0][0, 0] + tf.cast(b[1][-1], tf.float32)))

    consume()  # warm-up epoch
    t0 = time.perf_counter()
    samples = 0
    for _ in range(epochs):
        samples += int(consume()[0])
    sec = time.perf_counter() - t0
    rate = samples / sec
    common.result(peer="tensorflow", bench="pipeline", samples_per_s=f"{rate:.0f}",
                  gb_per_s=f"{rate * (784 * 4 + 4) / 1e9:.3f}", version=VERSION)


{"step": step_bench, "mirrored": mirrored_bench, "mainjob": mainjob, "pipeline": pipeline}[what]()
