"""The CPU line of the benchmark headers: model, vendor, family/model numbers and the matmul-relevant flags."""
import os

from benchmarks.lib.common import environment_line
from benchmarks.lib.machine import cpu_description, last_level_cache_bytes, read_cpuinfo

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: SomethingElse
"""


def test_cpu_description_names_the_model_and_only_the_matmul_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert read_cpuinfo(str(path))["vendor_id"] == "GenuineIntel"  # the first processor's block only
    assert cpu_description(str(path)) == ("cpu Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 207; "
                                          "avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8)")


def test_cpu_description_without_avx2_or_without_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
                    "flags\t\t: fpu sse sse2\n")
    assert cpu_description(str(path)) == "cpu AMD EPYC (AuthenticAMD family 25 model 17; no AVX2)"
    assert read_cpuinfo(str(tmp_path / "missing")) == {}
    assert cpu_description(str(tmp_path / "missing")).startswith("cpu ")


def test_environment_line_carries_this_machines_cpu_and_the_date():
    line = environment_line(2)
    assert cpu_description() in line
    if os.path.exists("/proc/cpuinfo"):
        assert read_cpuinfo()["model name"] in line
    assert " UTC" in line and "date 20" in line


def test_last_level_cache_is_the_largest_size_sysfs_reports(tmp_path):
    for index, size in enumerate(["48K", "2048K", "307200K", "1M"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(str(tmp_path)) == 307200 * 1024
    assert last_level_cache_bytes(str(tmp_path / "missing")) == 0
