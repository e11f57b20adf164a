#!/usr/bin/env python3
"""tf.data beside bench_images: the same JPEG files (written by `bench_images --write DIR`), the same
work on one thread: tf.image.sample_distorted_bounding_box (area 0.08-1, aspect 3/4-4/3, 10
attempts: Inception's random resized crop), tf.io.decode_and_crop_jpeg of that window (accurate
integer DCT, as lockstep decodes only the crop), tf.image.resize to S x S (bilinear),
tf.image.random_flip_left_right, (x / 255 - mean) / std, batches of 64. tf.data runs on a private
pool of one thread with intra-op parallelism 1, and TensorFlow's own thread pools have one thread.
One warm-up epoch, then E timed epochs. Prints
    images_samples_per_s=<n> samples=<n> seconds=<s> tensorflow=<version>
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--out", type=int, default=224)
    a = ap.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    files, labels = [], []
    with open(os.path.join(a.dir, "list.txt")) as f:
        for line in f:
            name, label = line.split()
            files.append(os.path.join(a.dir, name))
            labels.append(int(label))
    mean = tf.constant([0.485, 0.456, 0.406])
    std = tf.constant([0.229, 0.224, 0.225])

    def load(path, label):
        data = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        img = tf.io.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3, dct_method="INTEGER_ACCURATE")
        img = tf.image.resize(img, [a.out, a.out])  # bilinear, float32
        img = tf.image.random_flip_left_right(img)
        img = (img / 255.0 - mean) / std
        return img, label

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.deterministic = True
    ds = tf.data.Dataset.from_tensor_slices((files, labels)).map(load).batch(64).with_options(options)

    def epoch():
        n = 0
        for x, _ in ds:
            n += int(x.shape[0])
        return n

    epoch()  # warm-up
    start = time.perf_counter()
    samples = sum(epoch() for _ in range(a.epochs))
    t = time.perf_counter() - start
    print(f"images_samples_per_s={samples / t:.1f} samples={samples} seconds={t:.3f} tensorflow={tf.__version__}")


if __name__ == "__main__":
    main()
