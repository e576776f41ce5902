"""wording: how findings spell signatures (``short``), size lists, rank lists and group labels."""

from __future__ import annotations

from lightning_ncclx.analysis.model import GroupRef
from lightning_ncclx.analysis.wording import (
    group_label, group_title, rank_runs, ranks_label, ranks_text, short, sizes_text,
)


def test_sizes_text_joins_dimensions_with_x_and_tensors_with_commas():
    assert sizes_text(((4,), (2, 3))) == "4,2x3"
    assert sizes_text((5, (7,))) == "5,7"  # a bare int is one flat size
    assert sizes_text(((),)) == ""  # a scalar tensor has no dimensions
    assert sizes_text(()) == ""


def test_short_of_no_signature_is_nothing():
    assert short(None) == "nothing"


def test_short_shows_outputs_only_where_they_differ_from_inputs():
    assert short(("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))) == "all_reduce[4]/Float"
    assert short(("all_gather", ((4,),), ("Float",), ((3, 4),), ("Float",))) == "all_gather[4->3x4]/Float"
    assert short(("all_reduce", ((4,),), ("Float",), ((4,),), ("Half",))) == "all_reduce[4]/Float->Half"


def test_short_marks_empty_sides_with_a_dash():
    assert short(("barrier", (), (), (), ())) == "barrier[-]"
    # scatter on a non-root rank: no inputs recorded, outputs only
    assert short(("scatter", (), (), ((4,),), ("Float",))) == "scatter[-->4]/-->Float"
    # gather's outputs are left out of signatures: an empty output side is not "different"
    assert short(("gather", ((2, 2),), ("BFloat16",), (), ())) == "gather[2x2]/BFloat16"


def test_ranks_text_lists_up_to_twelve_ranks_in_full():
    assert ranks_text(()) == ""
    assert ranks_text((3,)) == "3"
    assert ranks_text(tuple(range(12))) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11"


def test_ranks_text_shortens_longer_lists_to_ten_and_a_count():
    assert ranks_text(tuple(range(13))) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (13 ranks)"
    assert ranks_text(tuple(range(100, 20100))).endswith("109, ... (20000 ranks)")


def test_group_label_names_desc_and_backend():
    assert group_label(GroupRef("5", "tp", (1, 3), "nccl")) == "group 5 (tp, nccl)"
    assert group_label(GroupRef("0", "", (0,), "gloo")) == "group 0 (rank 0, gloo)"
    assert group_label(GroupRef("1", "undefined", (0, 1, 2), "gloo")) == "group 1 (ranks 0-2, gloo)"


def test_rank_runs_compress_consecutive_ranks():
    assert rank_runs([5, 0, 1, 2, 7, 8, 8]) == ["0-2", "5", "7-8"] and rank_runs([]) == []


def test_ranks_label_says_what_a_set_of_ranks_stands_for():
    assert ranks_label([3]) == "rank 3"
    assert ranks_label(r for r in range(1024) if r != 700) == "ranks 0-699, 701-1023"
    assert ranks_label(range(0, 1024, 8)) == "128 ranks: 0, 8, 16, ..., 1016"
    assert ranks_label([]) == "no ranks"


def test_a_group_is_titled_by_its_description_or_else_by_its_ranks():
    assert group_title("tp", (0, 1)) == "tp"
    assert group_title("undefined", (4, 5, 6, 7)) == group_title("", (4, 5, 6, 7)) == "ranks 4-7"
    assert group_title("undefined", ()) == "ranks unknown"
