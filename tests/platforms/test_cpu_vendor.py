"""The CPU vendor read from /proc/cpuinfo (seq2seq_engine/platforms/cpu_vendor.py)."""
import os

from seq2seq_engine.platforms.cpu_vendor import CPUINFO, cpu_vendor, read_cpu_vendor


def test_the_first_vendor_id_of_the_file(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\n"
                    "processor\t: 1\nvendor_id\t: GenuineIntel\n")
    assert read_cpu_vendor(str(path)) == "AuthenticAMD"


def test_no_vendor_line_or_no_file_gives_an_empty_name(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nCPU implementer\t: 0x41\n")
    assert read_cpu_vendor(str(path)) == ""
    assert read_cpu_vendor(str(tmp_path / "missing")) == ""


def test_this_machines_vendor_is_the_files():
    expected = read_cpu_vendor(CPUINFO) if os.path.exists(CPUINFO) else ""
    assert cpu_vendor() == expected
