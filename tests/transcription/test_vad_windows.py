"""Packing speech regions into 30 s windows and mapping window times back
(seq2seq_engine.transcription.input.vad_windows), on hand-computed cases; stitching a packed window's timestamp tokens
into segments on the input's timeline."""
import numpy as np
import pytest

from seq2seq_engine.transcription import WindowTokens, stitch
from seq2seq_engine.transcription.input.vad_windows import (TimeMap, pack_regions, speech_windows, split_long_regions,
                                                            window_vad_options)

SR = 16000
W = 30 * SR


def s(seconds):
    return int(round(seconds * SR))


def regions(*pairs):
    return [(s(a), s(b)) for a, b in pairs]


def test_pack_is_greedy_in_order_and_within_the_window():
    # 10 + 13 = 23 s fit; + 10 = 33 s does not, so 40-50 opens window 2; 10 + 2 + 18 = 30 s fits exactly.
    found = pack_regions(regions((0, 10), (12, 25), (40, 50), (60, 62), (70, 88), (90, 91)), W)
    assert found == [regions((0, 10), (12, 25)), regions((40, 50), (60, 62), (70, 88)), regions((90, 91))]
    assert pack_regions([], W) == []
    assert pack_regions(regions((5, 35)), W) == [regions((5, 35))]  # exactly one window long


def test_a_region_longer_than_the_window_is_cut_into_window_sized_pieces():
    assert split_long_regions(regions((1, 71)), W) == regions((1, 31), (31, 61), (61, 71))
    # A small region after the cut pieces joins the last piece's window when it fits.
    assert pack_regions(regions((1, 71), (80, 81)), W) == [regions((1, 31)), regions((31, 61)),
                                                           regions((61, 71), (80, 81))]
    with pytest.raises(ValueError):
        split_long_regions(regions((0, 1)), 0)


def test_time_map_is_piecewise_over_the_regions():
    # Regions 1-3 s and 10-11.5 s: the window's 0-2 s are 1-3 s, its 2-3.5 s are 10-11.5 s.
    time_map = TimeMap(regions((1, 3), (10, 11.5)))
    assert time_map.duration == 3.5 and time_map.start_sample == s(1)
    assert time_map.to_original(0.0) == 1.0
    assert time_map.to_original(1.5) == 2.5
    assert time_map.to_original(2.0) == 10.0  # a boundary starts the later region...
    assert time_map.to_original(2.0, is_end=True) == 3.0  # ...or ends the earlier one
    assert time_map.to_original(2.5) == 10.5
    assert time_map.to_original(3.5, is_end=True) == 11.5
    assert time_map.to_original(9.0, is_end=True) == 11.5  # clamped to the window
    assert time_map.to_original(-1.0) == 1.0


def test_time_map_places_a_segment_in_the_region_holding_most_of_it():
    time_map = TimeMap(regions((1, 3), (10, 11.5)))
    assert time_map.span(0.5, 1.5) == (1.5, 2.5)
    assert time_map.span(1.0, 3.0) == (2.0, 3.0)  # 1 s on each side of the splice: the earlier region
    assert time_map.span(1.5, 3.0) == (10.0, 11.0)  # 0.5 s in the first region, 1 s in the second
    assert time_map.span(0.0, 2.5) == (1.0, 3.0)  # 2 s in the first, 0.5 s in the second
    assert time_map.span(3.2, 30.0) == (11.2, 11.5)  # clamped to the window
    assert time_map.span(2.0, 2.0) == (10.0, 10.0)  # empty: where it starts


def test_touching_regions_are_one_piece_and_bad_regions_are_refused():
    time_map = TimeMap(regions((1, 2), (2, 4), (6, 7)))
    assert time_map.regions == regions((1, 4), (6, 7))
    assert time_map.span(0.5, 2.5) == (1.5, 3.5)  # across the 2 s join: no gap there, nothing to clamp
    for bad in ([], regions((2, 1)), regions((1, 3), (2, 4))):
        with pytest.raises(ValueError):
            TimeMap(bad)


def test_speech_windows_concatenate_the_regions_samples_in_order():
    audio = np.arange(100 * SR, dtype=np.float32)
    windows = speech_windows(audio, regions((1, 2), (50, 60), (61, 85), (90, 92.5)), W)
    assert [w.time_map.regions for w in windows] == [regions((1, 2), (50, 60)), regions((61, 85), (90, 92.5))]
    expected = [np.concatenate([audio[s(1):s(2)], audio[s(50):s(60)]]),
                np.concatenate([audio[s(61):s(85)], audio[s(90):s(92.5)]])]
    for window, samples in zip(windows, expected):
        np.testing.assert_array_equal(window.samples, samples)
        assert len(window.samples) == window.time_map.num_samples <= W


def test_window_vad_options_cap_max_speech_at_the_window():
    assert window_vad_options(True, None, W).max_speech_duration_s == 30
    assert window_vad_options(True, {"max_speech_duration_s": 10}, W).max_speech_duration_s == 10
    assert window_vad_options(True, {"max_speech_duration_s": 60}, W).max_speech_duration_s == 30
    assert window_vad_options(True, {"min_silence_duration_ms": 160}, W).min_silence_duration_ms == 160
    assert window_vad_options(False, {"threshold": 0.2}, W) is None
    with pytest.raises(ValueError, match="unknown vad_parameters"):
        window_vad_options(False, {"treshold": 0.2}, W)  # checked even when off
    with pytest.raises(ValueError, match="speech_pad_ms"):
        window_vad_options(True, {"speech_pad_ms": 15000}, W)
    with pytest.raises(TypeError):
        window_vad_options("yes", None, W)


def test_missing_vad_weights_are_reported_before_any_audio_is_read(monkeypatch):
    from seq2seq_engine.audio import silero
    monkeypatch.setattr(silero.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(silero.VadUnavailable, match="pip install silero-vad"):
        window_vad_options(True, None, W)
    assert window_vad_options(False, None, W) is None


def test_stitch_places_a_packed_windows_segments_on_the_input_timeline():
    from test_transcription_units import EN, ts

    # The window holds 1-3 s and 10-11.5 s of the input; Whisper says 0.0-0.8 "100", 1.8-3.0 "200 201" (mostly
    # after the splice at 2.0), then text left open to the window's end.
    tokens = [ts(0.0), 100, ts(0.8), ts(1.8), 200, 201, ts(3.0), 300]
    window = WindowTokens(1.0, 3.5, tokens, TimeMap(regions((1, 3), (10, 11.5))))
    text, segments = stitch([window], EN, lambda ids: " " + "-".join(map(str, ids)), timestamps=True)
    assert text == "100 200-201 300"
    assert [(g.start, g.end, g.text) for g in segments] == [(1.0, 1.8, "100"), (10.0, 11.0, "200-201"),
                                                            (11.0, 11.5, "300")]
    text, segments = stitch([window], EN, lambda ids: " " + "-".join(map(str, ids)), timestamps=False)
    assert [(g.start, g.end) for g in segments] == [(1.0, 11.5)]  # one segment per window, first to last region


def test_a_packed_windows_words_map_through_its_time_map_like_its_segments():
    from test_transcription_units import EN, ts

    from seq2seq_engine.transcription.timing.words import WordTiming
    tokens = [ts(0.0), 100, ts(0.8), ts(1.8), 200, 201, ts(3.0), 300]
    window = WindowTokens(1.0, 3.5, tokens, TimeMap(regions((1, 3), (10, 11.5))))
    # Window times: " 200" straddles the splice at 2.0 s, mostly after it, so it lands in the 10-11.5 s region.
    window.words = [[WordTiming(" 100", [100], 0.1, 0.7, 0.9)],
                    [WordTiming(" 200", [200], 1.9, 2.4, 0.8), WordTiming(" 201", [201], 2.4, 2.9, 0.7)],
                    [WordTiming(" 300", [300], 3.0, 3.4, 0.6)]]
    expected = [[(1.1, 1.7, " 100")], [(10.0, 10.4, " 200"), (10.4, 10.9, " 201")], [(11.0, 11.4, " 300")]]
    _, segments = stitch([window], EN, lambda ids: " " + "-".join(map(str, ids)), timestamps=True)
    assert [[(w.start, w.end, w.word) for w in g.words] for g in segments] == expected
    for segment in segments:  # every word inside its segment's span on the input's timeline
        assert all(segment.start <= w.start <= w.end <= segment.end for w in segment.words)
    _, segments = stitch([window], EN, lambda ids: " " + "-".join(map(str, ids)), timestamps=False)
    assert [(w.start, w.end, w.word) for w in segments[0].words] == [w for seg in expected for w in seg]
    window.words = None
    _, segments = stitch([window], EN, lambda ids: " " + "-".join(map(str, ids)), timestamps=True)
    assert all(g.words is None for g in segments)


def test_a_segment_whose_words_fall_in_two_pieces_is_split_at_the_splice():
    from test_transcription_units import EN, ts

    from seq2seq_engine.transcription.timing.words import WordTiming

    # One segment over the whole window (beam search often writes no timestamp at the splice at 2.0 s): its
    # words say where each part was said; placed whole, " 100 101" would be timed in the 10-11.5 s region.
    tokens = [ts(0.0), 100, 101, 200, 201, ts(3.4)]
    window = WindowTokens(1.0, 3.5, tokens, TimeMap(regions((1, 3), (10, 11.5))))
    window.words = [[WordTiming(" 100", [100], 0.1, 0.6, 0.9), WordTiming(" 101", [101], 0.6, 1.2, 0.9),
                     WordTiming(" 200", [200], 2.1, 2.6, 0.8), WordTiming(" 201", [201], 2.6, 3.3, 0.7)]]
    text, segments = stitch([window], EN, lambda ids: " " + " ".join(map(str, ids)), timestamps=True)
    assert text == "100 101 200 201"
    assert [(g.start, g.end, g.text) for g in segments] == [(1.1, 2.2, "100 101"), (10.1, 11.3, "200 201")]
    assert [[w.word for w in g.words] for g in segments] == [[" 100", " 101"], [" 200", " 201"]]
    window.show_words = False   # words timed only to split (timestamps without word_timestamps): not output
    _, segments = stitch([window], EN, lambda ids: " " + " ".join(map(str, ids)), timestamps=True)
    assert [(g.start, g.end, g.text, g.words) for g in segments] == [(1.1, 2.2, "100 101", None),
                                                                     (10.1, 11.3, "200 201", None)]
    window.words = None   # without words the segment stays in the piece holding most of it
    _, segments = stitch([window], EN, lambda ids: " " + " ".join(map(str, ids)), timestamps=True)
    assert [(g.start, g.end) for g in segments] == [(1.0, 3.0)]


def test_pieces_covered_counts_the_pieces_a_segment_reaches_past_a_slack():
    time_map = TimeMap(regions((1, 3), (10, 11.5)))   # window 0-2 s is the first piece, 2-3.5 s the second
    assert time_map.pieces_covered(0.0, 3.4, 1.0) == 2
    assert time_map.pieces_covered(0.0, 3.4, 1.5) == 1
    assert time_map.pieces_covered(1.6, 3.4, 1.0) == 1   # 0.4 s into the first piece: within the slack
    assert time_map.pieces_covered(0.2, 1.9, 0.0) == 1
