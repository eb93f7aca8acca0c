/* libFuzzer target: the CIFAR-10 / CIFAR-100 binary reader, through
 * ampc_dataset_open on a folder holding the batch files.
 *
 * Input layout:
 *   [0]     bit 0: CIFAR-100 (else CIFAR-10); bit 1: train split;
 *           bits 2-7: limit (0: all records)
 *   [1]     loader options (see fuzz_dataset.h)
 *   [2..]   the file: test_batch.bin / data_batch_1..5.bin (CIFAR-10; the
 *           train split gets the same bytes in all five, so a limit can
 *           stop inside any of them) or test.bin / train.bin (CIFAR-100)
 * Records are 3073 (CIFAR-10) or 3074 (CIFAR-100) bytes: run with
 * -max_len of at least 3 records (run.sh uses 12800). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int c100 = data[0] & 1, train = (data[0] >> 1) & 1;
  size_t limit = data[0] >> 2;
  const uint8_t *file = data + 2;
  size_t len = size - 2;
  if (c100) {
    fuzz_write(train ? "train.bin" : "test.bin", file, len);
  } else if (!train) {
    fuzz_write("test_batch.bin", file, len);
  } else {
    static const char *const names[5] = {"data_batch_1.bin", "data_batch_2.bin",
                                         "data_batch_3.bin", "data_batch_4.bin",
                                         "data_batch_5.bin"};
    for (int i = 0; i < 5; i++) fuzz_write(names[i], file, len);
  }
  fuzz_open_dataset(c100 ? AMPC_DATASET_CIFAR100 : AMPC_DATASET_CIFAR10, train, limit, data[1],
                    1 + (data[1] & 3));
  return 0;
}
