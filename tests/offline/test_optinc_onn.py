"""The OptINC optics do the averaging and the quantisation, and their training matters.

What is checked: the designed network is exact on every input; the preprocessing P shrinks the
training set without computing the answer; untrained (random) and under-sized networks fail
the exactness test; DAC resolution and phase noise move the figures; hardware-aware training
recovers what the DAC and the noise take from the designed phases; the soft network's
gradient is the analytic one.
"""

from __future__ import annotations

import numpy as np
import pytest

from oddl.offline.optinc import model as om
from oddl.offline.optinc import train as ot
from oddl.offline.optinc.model import OptincError, OptincNetwork

# ---- structure and the designed network ---------------------------------------------------


@pytest.mark.parametrize("n, bits, m", [(2, 2, 1), (3, 4, 2), (4, 4, 2), (4, 4, 4), (5, 3, 3)])
def test_designed_network_is_exact_on_every_input(n, bits, m):
    net = OptincNetwork.designed(n, bits, m, phase_bits=None)
    x = om.all_inputs(n, bits)
    np.testing.assert_array_equal(net.forward(x), om.exact_mean(x))
    assert net.set_exact_fraction() == 1.0


def test_hardware_counts_and_half_the_mzis_of_svd():
    hw = OptincNetwork(4, 8).hardware()
    assert (hw["transceivers"], hw["digit_bits"], hw["block_size"]) == (4, 2, 5)  # PAM4
    assert hw["blocks"] == 255 and hw["hidden"] == 255 * 5
    assert hw["mzi_count"] == 2 * 255 * 10 and hw["svd_mzi_count"] == 2 * hw["mzi_count"]
    assert hw["training_set"] == 13 ** 4  # digit sums 0..12 at 4 positions


def test_preprocessing_shrinks_the_data_set_but_does_not_compute_the_answer():
    net = OptincNetwork(4, 4, 2)
    # the same mean (1) from different digit sums: P's outputs differ, the answer does not
    a, b = np.array([[4, 0, 0, 0]]), np.array([[1, 1, 1, 1]])
    sa, sb = net.digit_sums(a), net.digit_sums(b)
    assert sa.tolist() == [[0, 1]] and sb.tolist() == [[4, 0]]
    assert om.exact_mean(a) == om.exact_mean(b) == 1
    assert not np.allclose(net.preprocessed(sa), net.preprocessed(sb))
    # permutations of the servers give the same P output: the training set is the digit sums
    tuples, prob = net.training_set()
    assert len(tuples) == 13 ** 2 < 16 ** 4 and prob.sum() == pytest.approx(1.0)
    x = om.all_inputs(4, 4)
    sums = net.digit_sums(x)
    base = 13 ** np.arange(2)
    counts = np.bincount(sums @ base, minlength=169) / len(x)
    np.testing.assert_allclose(counts[tuples @ base], prob, atol=1e-12)


def test_receivers_decide_digits_with_fixed_thresholds_not_a_mean_ladder():
    net = OptincNetwork.designed(4, 4, 2, phase_bits=None)
    tuples, _ = net.training_set()
    digits = net.decide(tuples, net.effective_params(noise_rad=0.0))
    assert digits.max() == 3 and digits.min() == 0  # each output is one PAM4 symbol
    np.testing.assert_array_equal(digits, net.target_digits(tuples))


def test_bad_configurations_are_refused():
    with pytest.raises(OptincError, match="n_inputs"):
        OptincNetwork(1, 4)
    with pytest.raises(OptincError, match="bits"):
        OptincNetwork(4, 0)
    with pytest.raises(OptincError, match="must divide the level bits"):
        OptincNetwork(4, 8, 3)
    with pytest.raises(OptincError, match="blocks"):
        OptincNetwork(4, 4, blocks=0)
    with pytest.raises(OptincError, match="noise_rad"):
        OptincNetwork(4, 4, noise_rad=-0.1)
    with pytest.raises(OptincError, match="needs 15 blocks"):
        OptincNetwork.designed(4, 4, blocks=7)
    with pytest.raises(OptincError, match="start must be"):
        ot.train(OptincNetwork(2, 2), steps=1, start="warm")


# ---- training matters ---------------------------------------------------------------------


def test_untrained_random_phases_fail_the_exactness_test():
    for seed in range(3):
        assert OptincNetwork(4, 4, phase_bits=None, seed=seed).set_exact_fraction() < 0.05


def test_training_from_random_phases_reaches_exact_and_an_under_sized_network_cannot():
    net = OptincNetwork(2, 2, phase_bits=None, seed=0)
    result = ot.train(net, steps=600, lr=0.03, start="random", seed=0)
    assert result.exact_fraction_before < 0.5 and result.exact_fraction == 1.0
    x = om.all_inputs(2, 2)
    np.testing.assert_array_equal(net.forward(x), om.exact_mean(x))
    # one block: two thresholders for three rounding points of 2-bit levels (the designed
    # network uses 3 blocks; training can also use the other rows of a block, so 2 may do)
    for seed in range(4):
        small = OptincNetwork(2, 2, phase_bits=None, blocks=1, seed=seed)
        got = ot.train(small, steps=600, lr=0.03, start="random", seed=seed)
        assert got.exact_fraction < 0.9, seed


def test_dac_resolution_and_phase_noise_move_the_figures():
    net = OptincNetwork.designed(4, 4, 2, phase_bits=None)
    by_bits = [net.set_exact_fraction(phase_bits=b) for b in (6, 8, 12)]
    assert by_bits[0] < by_bits[1] < by_bits[2] == 1.0
    rng = np.random.default_rng(0)
    by_noise = [net.set_exact_fraction(noise_rad=s, realisations=4, rng=rng)
                for s in (0.0, 0.005, 0.05)]
    assert by_noise[0] == 1.0 > by_noise[1] > by_noise[2]
    # 8-bit levels need far more analog precision than 4-bit ones (docs/explanation/optinc.md)
    eight = OptincNetwork.designed(4, 8, 4, phase_bits=None)
    assert eight.set_exact_fraction(phase_bits=12) < by_bits[2]


def test_hardware_aware_training_recovers_what_the_dac_takes():
    net = OptincNetwork(4, 4, 2, phase_bits=8)
    result = ot.train(net, steps=600, lr=0.001, start="designed", seed=1, margin=0.1)
    assert result.exact_fraction_before < 0.98  # the designed phases on an 8-bit DAC miss 3 %
    assert result.exact_fraction > 0.999
    assert net.set_exact_fraction(noise_rad=0.0) == result.exact_fraction


def test_training_with_noise_in_the_loop_beats_the_designed_phases_under_that_noise():
    designed = OptincNetwork.designed(4, 4, 2, phase_bits=8)
    before = designed.set_exact_fraction(noise_rad=0.01, realisations=8,
                                         rng=np.random.default_rng(5))
    net = OptincNetwork(4, 4, 2, phase_bits=8, noise_rad=0.01)
    ot.train(net, steps=300, lr=0.003, start="designed", seed=1)
    after = net.set_exact_fraction(noise_rad=0.01, realisations=8, rng=np.random.default_rng(5))
    assert after > before + 0.03


def test_soft_network_gradient_matches_finite_differences():
    net = OptincNetwork(4, 4, 2, blocks=3, steepness=5.0, seed=2)
    tuples, _ = net.training_set()
    target = net.target_digits(tuples)
    idx = np.arange(0, len(tuples), 7)
    w = np.full(len(idx), 1.0 / len(idx))
    p = net.params.copy()
    _, grad = ot.loss_and_grad(net, p, tuples[idx], target[idx], w)
    h = 1e-6
    for j in [0, 5, 11, 23, len(p) // 2, len(p) // 2 + 7, len(p) - 1]:
        a, c = p.copy(), p.copy()
        a[j] += h
        c[j] -= h
        num = (ot.loss_and_grad(net, a, tuples[idx], target[idx], w)[0]
               - ot.loss_and_grad(net, c, tuples[idx], target[idx], w)[0]) / (2 * h)
        assert num == pytest.approx(grad[j], abs=1e-5)
