// A LeNet-size CNN in dlib, the network of benchmarks/compile/lenet.cpp (conv 5x5 (6) padded,
// max pool, conv 5x5 (16) unpadded, max pool, dense 400-120-84-10), trained with dlib's
// dnn_trainer and Adam for one epoch, then the test accuracy: the compile-cost counterpart of
// lenet.cpp (benchmarks/peers/dlib_compile_cost.sh).
#include <cstdio>
#include <vector>

#include <dlib/data_io.h>
#include <dlib/dnn.h>

using namespace dlib;

template <long N, typename SUBNET>
using con5_same = add_layer<con_<N, 5, 5, 1, 1, 2, 2>, SUBNET>;
template <long N, typename SUBNET>
using con5_valid = add_layer<con_<N, 5, 5, 1, 1, 0, 0>, SUBNET>;

using net_type = loss_multiclass_log<
    fc<10, relu<fc<84, relu<fc<120, max_pool<2, 2, 2, 2, relu<con5_valid<16, max_pool<2, 2, 2, 2, relu<con5_same<6,
    input<matrix<unsigned char>>>>>>>>>>>>>>;

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : ".";
  std::vector<matrix<unsigned char>> train_images, test_images;
  std::vector<unsigned long> train_labels, test_labels;
  load_mnist_dataset(dir, train_images, train_labels, test_images, test_labels);

  net_type net;
  dnn_trainer<net_type, adam> trainer(net, adam(0.0f, 0.9f, 0.999f));
  trainer.set_learning_rate(1e-3);
  trainer.set_mini_batch_size(128);
  trainer.set_max_num_epochs(1);
  trainer.train(train_images, train_labels);
  net.clean();

  const std::vector<unsigned long> predicted = net(test_images);
  std::size_t right = 0;
  for (std::size_t i = 0; i < test_images.size(); ++i) right += predicted[i] == test_labels[i];
  std::printf("test_accuracy=%.4f\n", static_cast<double>(right) / static_cast<double>(test_images.size()));
}
