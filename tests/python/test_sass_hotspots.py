"""bench/kernels/sass_hotspots.py: the per-opcode totals and the most-stalled instructions from the CSV that
Nsight Compute prints for a report's source page (banner lines before the table, thousands separators, predicated
instructions, several columns whose names start alike)."""
import pathlib

import pytest
from script_module import load_script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "kernels" / "sass_hotspots.py"
CSV = '''"Kernel Name","void k(int)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","Thread Instructions Executed"
"0x10","@!P0 BRA 0x40","5","3","100","3,200"
"0x20","HGMMA.64x64x16.F32.BF16 R56, gdesc[UR16], RZ, !UPT","50","40","1,000","32,000"
"0x30","IMAD R1, R2, R3, R4","10","2","3,000","96,000"
"0x40","IMAD.MOV.U32 R5, RZ, RZ, 0x1","1","0","500","16,000"
'''


def load():
    return load_script(SCRIPT)


def test_totals_per_opcode_and_the_most_stalled(tmp_path):
    m = load()
    path = tmp_path / "sass.csv"
    path.write_text("==PROF== Connected to process 1\n" + CSV)
    rows = m.read_rows(str(path))
    assert [r["executed"] for r in rows] == [100, 1000, 3000, 500]  # not the thread counts
    assert [r["stalls"] for r in rows] == [5, 50, 10, 1]  # all samples, not the not-issued ones
    assert m.opcode("@!P0 BRA 0x40") == "BRA" and m.opcode("IMAD.MOV.U32 R5, RZ, RZ, 0x1") == "IMAD"
    text = m.summary(rows, 2, "t")
    assert "4 SASS instructions; 4,600 warp instructions executed; 66 stall samples." in text
    assert "| IMAD | 2 | 3,500 | 76.1% | 11 | 16.7% |" in text  # IMAD and IMAD.MOV together
    most = text.split("most stall samples:")[1]
    assert most.index("HGMMA") < most.index("IMAD R1") and "BRA" not in most  # top 2 only


def test_a_table_without_the_counters_is_refused_by_name(tmp_path):
    m = load()
    path = tmp_path / "sass.csv"
    path.write_text('"Address","Source","Thread Instructions Executed"\n"0x10","NOP","32"\n')
    with pytest.raises(SystemExit, match="no column for instructions executed"):
        m.read_rows(str(path))
