"""OptINC numerical model: MZI/Clements physics, training, phase files, validation, cascade."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from oddl.drivers import optinc_model as om
from oddl.drivers.optinc_model import ClementsMesh, OptincError, OptincNetwork


def random_unitary(n: int, rng: np.random.Generator) -> np.ndarray:
    z = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    q, r = np.linalg.qr(z)
    return q * (np.diag(r) / np.abs(np.diag(r)))


# ---- MZI and mesh physics -----------------------------------------------------------------


def test_mzi_is_two_couplers_and_two_phases():
    b = np.array([[1, 1j], [1j, 1]]) / math.sqrt(2)
    for theta, phi in [(0.3, 1.1), (2.0, -0.7), (math.pi, 0.0)]:
        built = b @ np.diag([np.exp(1j * theta), 1]) @ b @ np.diag([np.exp(1j * phi), 1])
        np.testing.assert_allclose(om.mzi(theta, phi), built, atol=1e-15)
    np.testing.assert_allclose(om.mzi(math.pi, math.pi), np.eye(2), atol=1e-15)
    cross = np.abs(om.mzi(0.0, 0.0)) ** 2
    np.testing.assert_allclose(cross, [[0, 1], [1, 0]], atol=1e-15)


def test_mzi_vectorised_shape_and_unitarity():
    t = om.mzi(np.linspace(0, 6, 7), np.linspace(-3, 3, 7))
    assert t.shape == (7, 2, 2)
    eye = np.einsum("kji,kjl->kil", t.conj(), t)
    np.testing.assert_allclose(eye, np.broadcast_to(np.eye(2), (7, 2, 2)), atol=1e-14)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_random_mesh_is_unitary_with_clements_counts(n):
    rng = np.random.default_rng(n)
    mesh = ClementsMesh(n, rng.uniform(0, 2 * math.pi, n * n))
    u = mesh.unitary
    np.testing.assert_allclose(u.conj().T @ u, np.eye(n), atol=1e-12)
    assert mesh.mzi_count == n * (n - 1) // 2
    assert mesh.depth == n
    fields = rng.normal(size=(5, n)) + 1j * rng.normal(size=(5, n))
    np.testing.assert_allclose(mesh.propagate(fields), fields @ u.T, atol=1e-12)


def test_lossy_mesh_attenuates_and_default_mesh_is_identity():
    rng = np.random.default_rng(1)
    mesh = ClementsMesh(4, rng.uniform(0, 2 * math.pi, 16))
    sv = np.linalg.svd(mesh.matrix(loss_db_per_mzi=0.5), compute_uv=False)
    assert np.all(sv < 1.0) and np.all(sv >= 10 ** (-4 * 0.5 / 20) - 1e-12)
    np.testing.assert_allclose(ClementsMesh(4).unitary, np.eye(4), atol=1e-15)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_clements_decomposition_round_trip(n):
    rng = np.random.default_rng(100 + n)
    for u in (random_unitary(n, rng), np.eye(n), np.eye(n)[::-1],
              np.exp(-2j * math.pi * np.outer(range(n), range(n)) / n) / math.sqrt(n)):
        mesh = om.from_unitary(u)
        assert np.max(np.abs(mesh.unitary - u)) < 1e-9
        assert ClementsMesh.from_unitary(u).phases.shape == (n * n,)


def test_from_unitary_refuses_non_unitary_and_nan():
    with pytest.raises(OptincError, match="not unitary"):
        om.from_unitary(np.ones((3, 3)))
    with pytest.raises(OptincError, match="square"):
        om.from_unitary(np.ones((2, 3)))
    with pytest.raises(OptincError, match="NaN"):
        om.from_unitary(np.full((2, 2), np.nan))


def test_mesh_refuses_wrong_phase_count():
    with pytest.raises(OptincError, match="needs 16 phases"):
        ClementsMesh(4, np.zeros(12))


# ---- network structure --------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_mzi_count_unitary_diagonal_is_half_of_svd(n):
    ud = OptincNetwork(n, 4, "unitary+diagonal")
    svd = OptincNetwork(n, 4, "svd")
    assert ud.mzi_count == n * (n - 1) // 2
    assert svd.mzi_count == 2 * ud.mzi_count
    assert ud.attenuator_count == svd.attenuator_count == n


def test_n4_hardware_figures():
    hw = OptincNetwork(4, 4).hardware()
    assert hw["mzi_count"] == 6 and hw["attenuator_count"] == 4
    assert hw["splitter_loss_db"] == pytest.approx(6.021, abs=1e-3)


def test_cascade_mzi_counts():
    assert om.cascade_mzi_count(4) == 5 * 6  # 4 level-1 devices + 1 level-2 device
    assert om.cascade_mzi_count(4, mode="svd") == 5 * 12
    assert om.cascade_mzi_count(4, levels=1) == 6
    assert om.cascade_mzi_count(2, levels=3) == 7 * 1
    with pytest.raises(OptincError):
        om.cascade_mzi_count(1)


def test_network_refuses_bad_configuration():
    with pytest.raises(OptincError, match="mode"):
        OptincNetwork(4, 4, "reck")
    with pytest.raises(OptincError, match="n_inputs"):
        OptincNetwork(1, 4)
    with pytest.raises(OptincError, match="bits"):
        OptincNetwork(4, 0)
    with pytest.raises(OptincError, match="preprocessing"):
        OptincNetwork(4, 4, preprocessing="fft")
    with pytest.raises(OptincError, match="noise_rad"):
        OptincNetwork(4, 4, noise_rad=-0.1)


# ---- exactness, quantisation, noise -------------------------------------------------------


def test_exact_mean_rounds_half_up():
    x = np.array([[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1], [15, 15, 15, 14], [3, 4, 4, 4]])
    np.testing.assert_array_equal(om.exact_mean(x), [0, 1, 1, 15, 4])
    np.testing.assert_array_equal(om.exact_mean(np.array([[0, 0, 1], [0, 1, 1]])), [0, 1])


@pytest.mark.parametrize("pre", om.PREPROCESSING)
@pytest.mark.parametrize("mode", om.MODES)
@pytest.mark.parametrize("detection", om.DETECTION)
def test_designed_network_is_exact_on_all_inputs(pre, mode, detection):
    net = OptincNetwork.designed(4, 4, mode, preprocessing=pre, detection=detection,
                                 phase_bits=None)
    x = om.all_inputs(4, 4)
    assert net.exact_fraction(x) == 1.0
    np.testing.assert_array_equal(net.forward(x), om.exact_mean(x))


def test_designed_dft_mean_is_exact_at_8_bits_with_noise_and_loss():
    net = OptincNetwork.designed(4, 8, phase_bits=8, loss_db_per_mzi=0.3, noise_rad=0.02)
    x = om.sample_inputs(4, 8, 20000, np.random.default_rng(3))
    assert net.exact_fraction(x, realisations=4, rng=np.random.default_rng(4)) == 1.0


def test_phase_quantisation_grid_and_degradation():
    np.testing.assert_allclose(om.quantise_phase([0.1, 2 * math.pi - 0.01, -0.6], 3),
                               [0.0, 0.0, 2 * math.pi - math.pi / 4])
    np.testing.assert_allclose(om.quantise_phase([7.0], None), [7.0 - 2 * math.pi])
    net = OptincNetwork.designed(4, 4, preprocessing="identity", phase_bits=None)
    x = om.all_inputs(4, 4)
    assert net.exact_fraction(x) == 1.0
    assert net.exact_fraction(x, phase_bits=3) < 0.9


def test_strong_noise_degrades_and_is_seeded():
    net = OptincNetwork.designed(4, 4, preprocessing="identity", phase_bits=None)
    x = om.all_inputs(4, 4)
    weak = net.exact_fraction(x, noise_rad=0.005, realisations=4, rng=np.random.default_rng(0))
    strong = net.exact_fraction(x, noise_rad=0.2, realisations=4, rng=np.random.default_rng(0))
    assert weak > 0.99 and strong < 0.7
    a = net.forward(x, noise_rad=0.1, rng=np.random.default_rng(7))
    b = net.forward(x, noise_rad=0.1, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(5)
    for mode, det in [("svd", "intensity"), ("unitary+diagonal", "coherent")]:
        net = OptincNetwork(4, 4, mode, preprocessing="identity", detection=det,
                            loss_db_per_mzi=0.2, seed=2)
        a = rng.integers(0, 16, size=(64, 4)).astype(float)
        t = a.mean(axis=1)
        p = net.params.copy()
        _, grad, ggain = net._loss_and_grad(p, a, t, 1.2)
        h = 1e-6
        for i in range(0, len(p), 3):
            up, dn = p.copy(), p.copy()
            up[i] += h
            dn[i] -= h
            num = (net._loss_and_grad(up, a, t, 1.2)[0] - net._loss_and_grad(dn, a, t, 1.2)[0])
            assert num / (2 * h) == pytest.approx(grad[i], abs=1e-6)
        num_g = net._loss_and_grad(p, a, t, 1.2 + h)[0] - net._loss_and_grad(p, a, t, 1.2 - h)[0]
        assert num_g / (2 * h) == pytest.approx(ggain, abs=1e-6)


def test_training_full_precision_no_noise_is_exact_on_all_inputs():
    net = OptincNetwork(4, 4, phase_bits=None, seed=1)
    x = om.all_inputs(4, 4)
    assert net.exact_fraction(x) < 0.5  # random phases
    seen: list[tuple[int, int]] = []
    result = om.train(net, steps=600, restarts=1, noise_rad=0.0, seed=3,
                      progress=lambda step, total, loss: seen.append((step, total)))
    assert result.exact_fraction == 1.0 and result.eval_elements == 65536
    assert net.exact_fraction(x) == 1.0
    assert seen[-1] == (600, 600)


def test_hardware_aware_training_8bit_phases_with_noise():
    net = OptincNetwork(4, 4, phase_bits=8, seed=2)
    result = om.train(net, steps=800, noise_rad=0.02, seed=4)
    assert result.exact_fraction == 1.0
    assert result.exact_fraction_noisy is not None and result.exact_fraction_noisy >= 0.999
    x = om.all_inputs(4, 4)
    assert net.exact_fraction(x, noise_rad=0.02, realisations=4,
                              rng=np.random.default_rng(8)) >= 0.999


# ---- input validation ---------------------------------------------------------------------


@pytest.mark.parametrize("bad, message", [
    (np.array([[1.0, np.nan, 2.0, 3.0]]), "NaN or Inf"),
    (np.array([[1.0, np.inf, 2.0, 3.0]]), "NaN or Inf"),
    (np.array([[1, 2, 16, 3]]), "outside the 4-bit range 0..15"),
    (np.array([[1, -1, 2, 3]]), "outside the 4-bit range"),
    (np.array([[1.5, 2, 2, 3]]), "integer levels"),
    (np.array([[1, 2, 3]]), "4 inputs but the data has 3"),
    (np.array([1, 2, 3, 4]), "shape"),
    (np.array([["a", "b", "c", "d"]]), "numeric"),
])
def test_bad_inputs_are_refused(bad, message):
    net = OptincNetwork.designed(4, 4)
    with pytest.raises(OptincError, match=message):
        net.forward(bad)


def test_valid_float_and_small_int_inputs_are_accepted():
    net = OptincNetwork.designed(4, 4)
    x = np.array([[1, 2, 3, 4], [15, 15, 15, 15]])
    np.testing.assert_array_equal(net.forward(x.astype(np.float32)), [3, 15])
    np.testing.assert_array_equal(net.forward(x.astype(np.uint8)), [3, 15])
    assert net.forward(np.zeros((0, 4), dtype=np.int64)).shape == (0,)


def test_encode_decode_signed_values():
    v = np.array([-1.0, -0.25, 0.0, 0.5, 0.99])
    levels = om.encode_levels(v, 8, scale=1 / 128)
    assert levels.min() >= 0 and levels.max() <= 255
    np.testing.assert_allclose(om.decode_levels(levels, 8, 1 / 128), v, atol=1 / 256)
    with pytest.raises(OptincError, match="NaN"):
        om.encode_levels([np.nan], 8, 1.0)
    with pytest.raises(OptincError, match="scale"):
        om.encode_levels([0.1], 8, 0.0)


# ---- phase files --------------------------------------------------------------------------


def test_phase_file_round_trip(tmp_path):
    net = OptincNetwork(4, 4, "svd", noise_rad=0.02, loss_db_per_mzi=0.1, seed=9)
    path = tmp_path / "p.json"
    om.save_phases(path, net, {"training": {"steps": 3}})
    doc = json.loads(path.read_text())
    assert doc["format"] == om.PHASE_FILE_FORMAT and doc["version"] == 1
    assert doc["mzi_count"] == 12 and doc["mode"] == "svd" and doc["phase_bits"] == 8
    back = om.load_phases(path, 4, 4)
    np.testing.assert_array_equal(back.params, net.params)
    assert back.metadata == {"training": {"steps": 3}}
    assert (back.mode, back.noise_rad, back.loss_db_per_mzi) == ("svd", 0.02, 0.1)
    x = om.all_inputs(4, 4)
    np.testing.assert_array_equal(back.forward(x, noise_rad=0.0), net.forward(x, noise_rad=0.0))
    assert om.load_phases(path, phase_bits=None).phase_bits is None


def test_phase_file_for_other_n_or_bits_is_refused(tmp_path):
    path = tmp_path / "p.json"
    om.save_phases(path, OptincNetwork(4, 4), {})
    with pytest.raises(OptincError, match=r"N=4 inputs and 4-bit.*N=8 inputs and 4-bit"):
        om.load_phases(path, 8, 4)
    with pytest.raises(OptincError, match=r"N=4 inputs and 4-bit.*N=4 inputs and 8-bit"):
        om.load_phases(path, 4, 8)


def test_malformed_phase_files_are_refused(tmp_path):
    path = tmp_path / "p.json"
    with pytest.raises(OptincError, match="cannot read"):
        om.load_phases(path)
    path.write_text("{not json")
    with pytest.raises(OptincError, match="not valid JSON"):
        om.load_phases(path)
    path.write_text(json.dumps({"format": "something"}))
    with pytest.raises(OptincError, match="not an OptINC phase file"):
        om.load_phases(path)
    om.save_phases(path, OptincNetwork(4, 4), {})
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "version": 99}))
    with pytest.raises(OptincError, match="version 99"):
        om.load_phases(path)
    doc["meshes"][0]["theta"] = doc["meshes"][0]["theta"][:-1]
    path.write_text(json.dumps(doc))
    with pytest.raises(OptincError, match="needs 20 phases"):
        om.load_phases(path)


# ---- cascade ------------------------------------------------------------------------------


def test_cascade_of_ideal_devices_equals_double_rounding():
    net = OptincNetwork.designed(4, 4)
    x = np.random.default_rng(6).integers(0, 16, size=(5000, 16))
    res = om.cascade_forward(x, net, net)
    assert res.device_fraction == 1.0
    assert res.exact_fraction == res.ideal_fraction
    assert 0.5 < res.exact_fraction < 1.0  # double rounding is not always the rounded mean
    assert np.all(np.abs(res.levels - res.exact) <= 1)


def test_cascade_refuses_mismatched_levels():
    with pytest.raises(OptincError, match="disagree"):
        om.cascade_forward(np.zeros((1, 16), dtype=int), OptincNetwork(4, 4),
                           OptincNetwork(4, 8))
    with pytest.raises(OptincError, match="16 inputs"):
        om.cascade_forward(np.zeros((1, 15), dtype=int), OptincNetwork(4, 4),
                           OptincNetwork(4, 4))
