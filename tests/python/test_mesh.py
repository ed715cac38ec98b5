"""cad.mesh: CAD's group in a trainer's parallel layout (the ranks sharing this rank's index on every dimension
CAD does not span), and the heads a tensor-parallel rank holds."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cad
from cad import mesh

TITAN = {"pp": 1, "batch": 2, "cp": 2, "tp": 2}  # TorchTitan's order: tp varies fastest


def test_coordinates_are_row_major_with_the_last_dimension_fastest():
    assert mesh.coordinates(TITAN, 0) == {"pp": 0, "batch": 0, "cp": 0, "tp": 0}
    assert mesh.coordinates(TITAN, 1) == {"pp": 0, "batch": 0, "cp": 0, "tp": 1}
    assert mesh.coordinates(TITAN, 6) == {"pp": 0, "batch": 1, "cp": 1, "tp": 0}
    with pytest.raises(cad.CadError, match=r"rank must be an int in \[0, 7\], got 8"):
        mesh.coordinates(TITAN, 8)


def test_each_tp_index_has_its_own_group_over_data_and_context():
    assert mesh.cad_ranks(TITAN, 5, over=("batch", "cp")) == (1, 3, 5, 7)
    assert mesh.cad_ranks(TITAN, 2, over=("batch", "cp")) == (0, 2, 4, 6)
    assert mesh.groups(TITAN, ("batch", "cp")) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    # a group's order is the data x context index: rank 2 (batch 0, cp 1) is index 1 of its group
    assert mesh.cad_ranks(TITAN, 2, over=("batch", "cp")).index(2) == 1
    # Megatron-Core's default order tp-cp-ep-dp-pp, read from the right
    megatron = {"pp": 2, "dp": 2, "cp": 1, "tp": 2}
    assert mesh.groups(megatron, ("dp", "cp")) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert mesh.groups(megatron, ("pp", "dp", "cp")) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert mesh.groups({"dp": 4}, "dp") == [(0, 1, 2, 3)]


def test_bad_layouts_are_refused_naming_the_entry():
    with pytest.raises(cad.CadError, match=r"over names \['dp'\], not dimensions of the layout"):
        mesh.cad_ranks(TITAN, 0, over=("dp",))
    with pytest.raises(cad.CadError, match=r"layout\['tp'\] must be at least 1, got 0"):
        mesh.groups({"dp": 2, "tp": 0}, "dp")
    with pytest.raises(cad.CadError, match="layout must be a mapping"):
        mesh.groups([2, 2], "dp")


def test_heads_per_rank_splits_whole_kv_heads_or_refuses_naming_the_numbers():
    assert mesh.heads_per_rank(32, 8, 2) == (16, 4)
    assert mesh.heads_per_rank(32, 8, 8) == (4, 1)
    with pytest.raises(cad.CadError, match="num_kv_heads 2 is not divisible by the tensor-parallel size 4"):
        mesh.heads_per_rank(8, 2, 4)
    with pytest.raises(cad.CadError, match="num_heads 6 is not divisible by the tensor-parallel size 4"):
        mesh.heads_per_rank(6, 6, 4)
    with pytest.raises(cad.CadError, match="num_heads 6 is not a multiple of num_kv_heads 4"):
        mesh.heads_per_rank(6, 4, 2)


def _groups_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        group = mesh.cad_group({"dp": 1, "tp": 2}, over="dp")  # each TP index its own group (of one rank here)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=group)  # the sum over this rank's group only
        world_group = mesh.cad_group({"dp": 2, "tp": 1}, over="dp")
        result = (dist.get_process_group_ranks(group), float(t), world_group is dist.group.WORLD)
        try:
            mesh.cad_group({"dp": 2, "tp": 2}, over="dp")
        except cad.CadError as err:
            result += (str(err),)
        with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
            f.write(repr(result))
    finally:
        dist.destroy_process_group()


def test_cad_group_is_the_process_group_of_this_ranks_tp_index(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_groups_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    refused = "cad.mesh.cad_group: the layout {'dp': 2, 'tp': 2} holds 4 ranks, the world has 2"
    assert [eval((tmp_path / f"{r}.txt").read_text()) for r in range(2)] == [
        ([0], 1.0, True, refused), ([1], 2.0, True, refused)]
