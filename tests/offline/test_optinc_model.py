"""OptINC model: MZI/Clements physics, U·Σ blocks, levels and digits, phase files, cascade."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from oddl.offline.optinc import mesh as mesh
from oddl.offline.optinc import model as om
from oddl.offline.optinc.model import ClementsMesh, OptincError, OptincNetwork


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


# ---- U·Σ blocks ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 5])
def test_block_is_unitary_times_diagonal_with_half_the_mzis(k):
    rng = np.random.default_rng(k)
    p = rng.uniform(0, 2 * math.pi, (3, mesh.block_param_count(k)))
    w, u, sigma, _ = mesh.block_matrices(p, k)
    for b in range(3):
        np.testing.assert_allclose(u[b].conj().T @ u[b], np.eye(k), atol=1e-12)
        np.testing.assert_allclose(w[b], u[b] @ np.diag(sigma[b]), atol=1e-12)
        # U·Σ has orthogonal columns: W^H W is diagonal (the V† of a full U·Σ·V† is missing)
        gram = w[b].conj().T @ w[b]
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-12)
    assert np.all((sigma >= -1e-15) & (sigma <= 1 + 1e-15))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_block_gradients_match_finite_differences(k):
    rng = np.random.default_rng(10 + k)
    p = rng.uniform(0, 2 * math.pi, (2, mesh.block_param_count(k)))
    g = rng.normal(size=(2, k, k)) + 1j * rng.normal(size=(2, k, k))

    def loss(q):
        return float(np.sum(np.real(np.conj(g) * mesh.block_matrices(q, k)[0])))

    grad = mesh.block_gradients(p, k, g)
    h = 1e-6
    for b in range(2):
        for j in range(p.shape[1]):
            a, c = p.copy(), p.copy()
            a[b, j] += h
            c[b, j] -= h
            assert abs((loss(a) - loss(c)) / (2 * h) - grad[b, j]) < 1e-6


@pytest.mark.parametrize("k", [2, 3, 5])
def test_designed_block_realises_any_row_of_norm_at_most_one(k):
    rng = np.random.default_rng(k)
    row = rng.normal(size=k) + 1j * rng.normal(size=k)
    row *= 0.8 / np.linalg.norm(row)
    w = mesh.block_matrices(mesh.designed_block(row, k)[None], k)[0][0]
    np.testing.assert_allclose(w[0], row, atol=1e-12)
    with pytest.raises(OptincError, match=r"\|row\| ≤ 1"):
        mesh.designed_block(row * 2, k)


# ---- levels and digits --------------------------------------------------------------------


def test_exact_mean_rounds_half_up():
    x = np.array([[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1], [15, 15, 15, 14], [3, 4, 4, 4]])
    np.testing.assert_array_equal(om.exact_mean(x), [0, 1, 1, 15, 4])
    np.testing.assert_array_equal(om.exact_mean(np.array([[0, 0, 1], [0, 1, 1]])), [0, 1])


def test_levels_travel_as_digits_on_m_transceivers():
    x = np.array([0, 1, 17, 200, 255])
    d = om.to_digits(x, 8, 4)
    assert d.shape == (5, 4) and d.max() == 3
    np.testing.assert_array_equal(d[2], [1, 0, 1, 0])  # 17 = 1 + 0·4 + 1·16, PAM4 digits
    np.testing.assert_array_equal(om.from_digits(d, 8), x)
    np.testing.assert_array_equal(om.from_digits(om.to_digits(x, 8, 8), 8), x)
    with pytest.raises(OptincError, match="must divide the level bits"):
        om.to_digits(x, 8, 3)


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
    net = OptincNetwork.designed(4, 4, phase_bits=None)
    with pytest.raises(OptincError, match=message):
        net.forward(bad)


def test_valid_float_and_small_int_inputs_are_accepted():
    net = OptincNetwork.designed(4, 4, phase_bits=None)
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
    net = OptincNetwork(4, 4, noise_rad=0.02, phase_bits=10, seed=9)
    path = tmp_path / "p.json"
    om.save_phases(path, net, {"training": {"steps": 3}})
    doc = json.loads(path.read_text())
    assert doc["format"] == om.PHASE_FILE_FORMAT and doc["version"] == 2
    assert (doc["transceivers"], doc["blocks"], doc["block_size"]) == (2, 15, 3)
    assert doc["mzi_count"] == 2 * 15 * 3 and doc["phase_bits"] == 10
    back = om.load_phases(path, 4, 4)
    np.testing.assert_allclose(back.params, net.params, atol=1e-8)
    assert back.metadata == {"training": {"steps": 3}}
    assert (back.noise_rad, back.phase_bits, back.transceivers) == (0.02, 10, 2)
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
    path.write_text(json.dumps({**doc, "version": 1}))
    with pytest.raises(OptincError, match="version 1.*train new phases"):
        om.load_phases(path)
    doc["params"] = doc["params"][:-1]
    path.write_text(json.dumps(doc))
    with pytest.raises(OptincError, match="needs 360 phases, got 359"):
        om.load_phases(path)


def test_shipped_phase_file_is_exact_without_noise():
    net = om.shipped_phases(4, 8)
    assert net is not None and net.phase_bits == 16 and net.transceivers == 4
    assert net.metadata["training"]["exact_fraction"] == 1.0
    x = om.sample_inputs(4, 8, 20_000, np.random.default_rng(0))
    assert net.exact_fraction(x, noise_rad=0.0) == 1.0
    assert om.shipped_phases(4, 4) is None


# ---- cascade ------------------------------------------------------------------------------


def test_cascade_of_exact_devices_equals_double_rounding():
    net = OptincNetwork.designed(4, 4, phase_bits=None)
    x = np.random.default_rng(6).integers(0, 16, size=(5000, 16))
    res = om.cascade_forward(x, net, net)
    assert res.device_fraction == 1.0
    assert res.exact_fraction == res.ideal_fraction
    assert 0.5 < res.exact_fraction < 1.0  # double rounding is not always the rounded mean
    assert np.all(np.abs(res.levels - res.exact) <= 1)


def test_uneven_cascade_and_mismatch_refusal():
    l1 = OptincNetwork.designed(4, 4, phase_bits=None)
    l2 = OptincNetwork.designed(2, 4, phase_bits=None)
    x = np.random.default_rng(7).integers(0, 16, size=(2000, 8))
    assert om.cascade_forward(x, l1, l2).device_fraction == 1.0
    with pytest.raises(OptincError, match="disagree"):
        om.cascade_forward(np.zeros((1, 16), dtype=int), OptincNetwork(4, 4),
                           OptincNetwork(4, 8))
    with pytest.raises(OptincError, match="16 inputs"):
        om.cascade_forward(np.zeros((1, 15), dtype=int), OptincNetwork(4, 4),
                           OptincNetwork(4, 4))


def test_cascade_mzi_counts():
    per = OptincNetwork(4, 4).mzi_count
    assert om.cascade_mzi_count(4, bits=4) == 5 * per  # 4 level-1 devices + 1 level-2 device
    assert om.cascade_mzi_count(4, levels=1, bits=4) == per
    with pytest.raises(OptincError):
        om.cascade_mzi_count(1)
