import pickle
import pickletools
from pathlib import Path

import pytest

from lightning_ncclx.analysis.safe_pickle import safe_loads
from lightning_ncclx.errors import DumpReadError

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl-h200"


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_real_dumps_need_no_globals():
    for name in ("watchdog_timeout_rank_0.pkl", "ws1_2000_entries.pkl"):
        raw = (DATA / name).read_bytes()
        assert not {op.name for op, _, _ in pickletools.genops(raw)} & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ"}
        assert safe_loads(raw) == pickle.loads(raw)


def test_malicious_reduce_is_refused_before_it_runs(capsys):
    with pytest.raises(DumpReadError, match="refused to load builtins.print"):
        safe_loads(pickle.dumps(_Evil()))
    assert "pwned" not in capsys.readouterr().out


@pytest.mark.parametrize("raw", [b"\x80\x04\x95", b"\x80\x05garbage", b""])
def test_truncated_or_garbage_pickle_is_a_dump_read_error(raw):
    with pytest.raises(DumpReadError, match="not a valid pickle"):
        safe_loads(raw)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_any_protocol_reads_as_pickle_loads_reads_it(protocol):
    """Frames, data across frame ends, long strings, nesting: the unpickler's file hands over
    everything at once and it must read on from its own buffer exactly as ``pickle.loads``."""
    blob = b"y" * 70_000 if protocol > 2 else "y" * 70_000  # protocol 2 pickles bytes through a global
    value = {"entries": [{"s": "x" * 100_000, "n": [1, -2, 2**70, 2.5, None, True], "b": blob,
                          "t": (1, (2, [3])), "d": {}} for _ in range(40)], "version": "2.10"}
    raw = pickle.dumps(value, protocol=protocol)
    assert safe_loads(raw) == value == pickle.loads(raw)
    with pytest.raises(DumpReadError, match="not a valid pickle"):
        safe_loads(raw[: len(raw) // 2])
