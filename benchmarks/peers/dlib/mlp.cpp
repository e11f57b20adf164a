// The main job's network in dlib — 784-512-256-10 with ReLU and dropout 0.2, softmax
// cross-entropy, Adam with weight decay, mini-batches of 128, 20 epochs, then the test accuracy —
// the compile-cost counterpart of lockstep's examples/fashion_mnist (benchmarks/peers/dlib_compile_cost.sh).
#include <cstdio>
#include <vector>

#include <dlib/data_io.h>
#include <dlib/dnn.h>

using namespace dlib;

using net_type = loss_multiclass_log<fc<10, dropout<relu<fc<256, dropout<relu<fc<512, input<matrix<unsigned char>>>>>>>>>>;

int main(int argc, char** argv) {
  // dlib reads the uncompressed IDX files: pass the folder holding them.
  const char* dir = argc > 1 ? argv[1] : ".";
  std::vector<matrix<unsigned char>> train_images, test_images;
  std::vector<unsigned long> train_labels, test_labels;
  load_mnist_dataset(dir, train_images, train_labels, test_images, test_labels);

  net_type net(fc_<10, FC_HAS_BIAS>(), dropout_(0.2f), relu_(), fc_<256, FC_HAS_BIAS>(), dropout_(0.2f));
  dnn_trainer<net_type, adam> trainer(net, adam(0.02f, 0.9f, 0.999f));
  trainer.set_learning_rate(1e-3);
  trainer.set_min_learning_rate(1e-6);
  trainer.set_mini_batch_size(128);
  trainer.set_max_num_epochs(20);
  trainer.train(train_images, train_labels);
  net.clean();

  const std::vector<unsigned long> predicted = net(test_images);
  std::size_t right = 0;
  for (std::size_t i = 0; i < test_images.size(); ++i) right += predicted[i] == test_labels[i];
  std::printf("test_accuracy=%.4f\n", static_cast<double>(right) / static_cast<double>(test_images.size()));
}
