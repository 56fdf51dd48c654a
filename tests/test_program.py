"""The kernel mechanism (`kernels/program.launch`) on the CPU, with a C program: an in-place
update realized with `in_place` runs once, however its outputs are read afterwards (tinygrad
runs a call once per realize of one of its outputs)."""
import numpy as np
from tinygrad import Tensor, dtypes

from nuvec_tg.kernels.program import launch

READ_THEN_ADD = """void read_then_add(float* restrict y, float* restrict pool, const float* restrict x) {
  for (int i = 0; i < 8; i++) { y[i] = pool[i]; pool[i] = pool[i] + x[i]; }
}"""


def test_an_in_place_update_runs_once():
    pool = Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()
    x = Tensor(np.ones(8, dtype=np.float32), device="CPU").realize()
    y, updated = launch("read_then_add", READ_THEN_ADD, "CPU", [Tensor.empty(8, dtype=dtypes.float32, device="CPU"), pool],
                        [x], [], (1, 1, 1), (1, 1, 1), in_place=True)
    np.testing.assert_array_equal(y.numpy(), np.arange(8))            # read before the update
    np.testing.assert_array_equal(updated.numpy(), np.arange(8) + 1)  # updated once
    np.testing.assert_array_equal(pool.numpy(), np.arange(8) + 1)     # in the caller's buffer
