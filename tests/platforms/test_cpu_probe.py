"""The one probe of the CPU (platforms/cpu_probe.py): /proc/cpuinfo's first processor and sysfs caches."""
import os

from seq2seq_engine.platforms.cpu_probe import (CPUINFO, cpu_info, parse_cache_size, probe_cpu, read_cache_sizes,
                                                read_cpuinfo)

ZEN4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
        "flags\t\t: fpu sse avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_vnni\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: fpu\n")


def _sysfs(tmp_path, caches):
    for index, (level, kind, size) in enumerate(caches):
        folder = tmp_path / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    return str(tmp_path / "cache")


def test_the_first_processor_gives_vendor_model_and_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(ZEN4)
    sysfs = _sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                              (3, "Unified", "32768K")])
    info = probe_cpu(str(path), sysfs)
    assert (info.vendor, info.model_name) == ("AuthenticAMD", "AMD EPYC 9R14")
    assert info.has("avx512f", "avx512_bf16") and not info.has("amx_tile") and not info.has("fpu", "amx_int8")
    assert (info.l2_bytes, info.l3_bytes) == (1 << 20, 32 << 20)
    assert info.isa_flags == "avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_vnni"
    assert info.cores >= 1


def test_a_missing_file_or_sysfs_gives_empty_facts(tmp_path):
    info = probe_cpu(str(tmp_path / "missing"), str(tmp_path / "none"))
    assert (info.vendor, info.model_name, info.flags, info.l2_bytes, info.l3_bytes) == ("", "", frozenset(), 0, 0)
    assert info.isa_flags == "-"
    assert read_cpuinfo(str(tmp_path / "missing")) == {}


def test_instruction_caches_are_not_counted_and_sizes_parse_their_units(tmp_path):
    sysfs = _sysfs(tmp_path, [(1, "Instruction", "64K"), (2, "Unified", "2M")])
    assert read_cache_sizes(sysfs) == {2: 2 << 20}
    assert [parse_cache_size(text) for text in ("512K", "32M", "1G", "4096", "x", "")] == [
        512 << 10, 32 << 20, 1 << 30, 4096, 0, 0]


def test_this_machines_probe_reads_this_machines_file():
    expected = read_cpuinfo(CPUINFO) if os.path.exists(CPUINFO) else {}
    assert cpu_info().vendor == expected.get("vendor_id", "")
    assert cpu_info().flags == frozenset(expected.get("flags", "").split())
    assert cpu_info() is cpu_info()
