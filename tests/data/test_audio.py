"""Audio in (WAV reading, resampling) and Whisper's log-mel features, against outside readers (Python's
``wave``, scipy's ``wavfile``) and Hugging Face's ``WhisperFeatureExtractor`` on real recordings."""

import os
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from tformer.data.audio import AudioError, load_audio, read_wav, resample
from tformer.data.log_mel import (
    NORMALIZATION_EPS,
    LogMelSettings,
    log_mel_spectrogram,
    mel_filter_bank,
    normalize_windows,
    pad_or_trim,
    recording_features,
)

FSDD = Path(__file__).resolve().parents[3] / "shared" / "data" / "fsdd" / "recordings"
needs_fsdd = pytest.mark.skipif(not FSDD.is_dir(), reason="../shared/data/fsdd is absent")


def _write_pcm(path: Path, samples: np.ndarray, rate: int, width: int) -> None:
    """Integer PCM through the standard library's writer: samples (N, channels) already as integers."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(samples.shape[1])
        out.setsampwidth(width)
        out.setframerate(rate)
        if width == 3:
            raw = samples.astype("<i4").reshape(-1, 1).view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
        else:
            raw = samples.astype({1: np.uint8, 2: "<i2", 4: "<i4"}[width]).tobytes()
        out.writeframes(raw)


def _riff(fmt: bytes, data: bytes, data_size: int | None = None, extra: bytes = b"") -> bytes:
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra
    chunks += b"data" + struct.pack("<I", len(data) if data_size is None else data_size) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def _fmt(tag: int, channels: int, rate: int, bits: int) -> bytes:
    align = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_integer_pcm_reads_as_scaled_floats_averaged_to_mono(tmp_path, width, channels):
    rng = np.random.default_rng(width * 10 + channels)
    bits = 8 * width
    if width == 1:
        integers = rng.integers(0, 256, size=(500, channels))
        expected = (integers - 128) / 128.0
    else:
        integers = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(500, channels))
        expected = integers / float(1 << (bits - 1))
    _write_pcm(tmp_path / "a.wav", integers, 11_025, width)
    audio = read_wav(tmp_path / "a.wav")
    assert audio.sample_rate == 11_025 and audio.samples.dtype == np.float32
    np.testing.assert_allclose(audio.samples, expected.mean(axis=1), atol=1e-6)


@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
@pytest.mark.parametrize("extensible", [False, True])
def test_float_wav_plain_or_extensible_equals_scipy_s_reader(tmp_path, dtype, extensible):
    wavfile = pytest.importorskip("scipy.io.wavfile")
    samples = np.random.default_rng(0).uniform(-1, 1, size=(300, 3)).astype(dtype)
    bits = 8 * samples.itemsize
    if extensible:
        fmt = _fmt(0xFFFE, 3, 22_050, bits) + struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", 3) + \
            bytes.fromhex("000000001000800000aa00389b71")
    else:
        fmt = _fmt(3, 3, 22_050, bits)
    (tmp_path / "f.wav").write_bytes(_riff(fmt, samples.tobytes(), extra=b"LIST" + struct.pack("<I", 3) + b"abc\0"))
    rate, reference = wavfile.read(tmp_path / "f.wav")
    audio = read_wav(tmp_path / "f.wav")
    assert audio.sample_rate == rate == 22_050
    np.testing.assert_allclose(audio.samples, reference.astype(np.float64).mean(axis=1), atol=1e-6)


@needs_fsdd
def test_a_real_recording_reads_as_the_standard_library_reads_it():
    path = FSDD / "7_jackson_12.wav"
    with wave.open(str(path)) as source:
        expected = np.frombuffer(source.readframes(source.getnframes()), "<i2") / 32768.0
        rate = source.getframerate()
    audio = read_wav(path)
    assert audio.sample_rate == rate == 8000
    np.testing.assert_array_equal(audio.samples, expected.astype(np.float32))


@pytest.mark.parametrize(("content", "message"), [
    (b"ID3\x04 an mp3 file, really", "not a RIFF/WAVE file; tformer reads WAV files"),
    (_riff(_fmt(0x55, 1, 8000, 16), b"\0" * 100), "codec 0x0055 is not supported; tformer reads PCM 8/16/24/32"),
    (_riff(_fmt(1, 1, 8000, 12), b"\0" * 100), "PCM 12-bit is not supported"),
    (_riff(_fmt(1, 1, 8000, 16), b""), "no samples"),
    (_riff(_fmt(1, 1, 8000, 16), b"\0" * 100, data_size=1_000_000), "truncated or corrupt WAV file"),
    (b"RIFF\x10\0\0\0WAVEdata\x04\0\0\0\0\0\0\0", r"corrupt WAV header \(the data chunk comes before"),
    (_riff(_fmt(1, 2, 8000, 16)[:12] + struct.pack("<HH", 3, 16), b"\0" * 12), "corrupt WAV header"),
])
def test_bad_audio_is_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(AudioError, match=message) as caught:
        read_wav(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("make", "kind"), [
    (lambda tmp_path: Path(os.devnull), "a character device"),
    (lambda tmp_path: tmp_path, "a folder"),
    (lambda tmp_path: (os.mkfifo(tmp_path / "pipe.wav"), tmp_path / "pipe.wav")[1], "a named pipe"),
], ids=["dev-null", "folder", "fifo"])
def test_what_is_no_regular_file_is_named_so(tmp_path, make, kind):
    """/dev/null was reported as 'no such file'; a named pipe would block the read: neither is opened."""
    path = make(tmp_path)
    with pytest.raises(AudioError) as caught:
        read_wav(path)
    assert str(caught.value) == f"{path}: not a regular file ({kind}); give a WAV file"
    with pytest.raises(AudioError, match="no such file"):
        read_wav(tmp_path / "gone.wav")


@pytest.mark.parametrize(("dtype", "value", "shown"), [
    ("<f4", np.nan, "NaN"), ("<f4", -np.inf, "infinite"), ("<f4", 3e29, "3e+29"), ("<f4", -1000.5, "-1000.5"),
    ("<f8", np.nan, "NaN"), ("<f8", np.inf, "infinite"), ("<f8", 1e300, "1e+300")])
def test_float_samples_must_be_finite_and_within_the_bound(tmp_path, dtype, value, shown):
    samples = np.zeros((800, 2), dtype=dtype)
    samples[400, 1] = samples[600, 0] = value  # the first at frame 400 of 8000 Hz: 0.050 s
    (tmp_path / "f.wav").write_bytes(_riff(_fmt(3, 2, 8000, 8 * samples.itemsize), samples.tobytes()))
    with pytest.raises(AudioError) as caught:
        load_audio(tmp_path / "f.wav", sample_rate=16_000)
    assert str(caught.value) == (f"{tmp_path / 'f.wav'}: 2 float sample(s) NaN, infinite or beyond +-1000 (the first, "
                                 f"at 0.050 s: {shown}); float WAV samples must be finite and within +-1000 "
                                 "(nominally [-1, 1])")


def test_loud_float_samples_within_the_bound_are_kept(tmp_path):
    samples = np.array([0.5, -2.0, 1000.0, -1000.0], dtype="<f4")
    (tmp_path / "f.wav").write_bytes(_riff(_fmt(3, 1, 8000, 32), samples.tobytes()))
    np.testing.assert_array_equal(read_wav(tmp_path / "f.wav").samples, samples)


def test_a_file_past_the_length_limit_is_refused(tmp_path):
    _write_pcm(tmp_path / "long.wav", np.zeros((8000 * 3, 1), dtype=np.int64), 8000, 2)
    assert read_wav(tmp_path / "long.wav", max_seconds=None).seconds == 3.0
    with pytest.raises(AudioError, match=r"3.0 s of audio, past the limit of 2 s \(max_seconds\)"):
        read_wav(tmp_path / "long.wav", max_seconds=2)


def test_resampling_keeps_a_tone_and_removes_what_the_new_rate_cannot_hold():
    pytest.importorskip("soxr")
    times_8k, times_16k = np.arange(16_000) / 8000, np.arange(32_000) / 16_000
    output = resample(np.sin(2 * np.pi * 1000 * times_8k), 8000, 16_000)
    inner = slice(1600, -1600)  # filters' start-up at the ends left out
    error = output[inner] - np.sin(2 * np.pi * 1000 * times_16k)[inner]
    assert len(output) == 32_000 and 10 * np.log10(0.5 / np.mean(error ** 2)) > 60  # 60 dB below the tone
    above_nyquist = resample(np.sin(2 * np.pi * 9000 * np.arange(44_100) / 44_100), 44_100, 16_000)
    assert np.abs(above_nyquist[1600:-1600]).max() < 1e-3  # filtered out, not folded to 7 kHz
    same = np.arange(5, dtype=np.float64)
    assert resample(same, 8000, 8000).dtype == np.float32


def _hf_extractor(num_mel_bins: int):
    transformers = pytest.importorskip("transformers")
    return transformers.WhisperFeatureExtractor(feature_size=num_mel_bins)


def _clips() -> list[np.ndarray]:
    """Real recordings (three speakers, resampled from 8 kHz) and synthetic tones: a chord, a sweep, silence."""
    times = np.arange(16_000 * 2) / 16_000
    tones = [0.3 * np.sin(2 * np.pi * 440 * times) + 0.1 * np.sin(2 * np.pi * 3100 * times),
             0.5 * np.sin(2 * np.pi * (100 + 1900 * times) * times), np.zeros(8000)]
    recordings = [load_audio(FSDD / name) for name in ("3_theo_7.wav", "9_george_30.wav", "0_yweweler_2.wav")] \
        if FSDD.is_dir() and _has_soxr() else []
    return [clip.astype(np.float32) for clip in recordings + tones]


def _has_soxr() -> bool:
    try:
        import soxr  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("num_mel_bins", [80, 128])
def test_features_equal_hugging_face_s_whisper_feature_extractor(num_mel_bins):
    extractor = _hf_extractor(num_mel_bins)
    np.testing.assert_allclose(mel_filter_bank(num_mel_bins, 400, 16_000), extractor.mel_filters, atol=1e-12)
    clips = _clips()
    expected = extractor(clips, sampling_rate=16_000, return_tensors="np").input_features
    settings = LogMelSettings(num_mel_bins=num_mel_bins)
    batch = torch.stack([pad_or_trim(torch.from_numpy(clip), settings.window_samples) for clip in clips])
    features = log_mel_spectrogram(batch, settings)
    assert features.shape == (len(clips), num_mel_bins, settings.window_frames) == expected.shape
    np.testing.assert_allclose(features.numpy(), expected, atol=1e-4)
    one = log_mel_spectrogram(batch[0], settings)  # one example alone: its own peak, as in the batch
    torch.testing.assert_close(one, features[0], atol=1e-6, rtol=0)


def test_features_of_any_length_have_a_frame_every_hop():
    audio = torch.randn(2, 16_000 * 3 + 77)
    features = log_mel_spectrogram(audio)
    assert features.shape == (2, 80, (16_000 * 3 + 77) // 160)
    assert torch.all(features.amax(dim=(1, 2)) - features.amin(dim=(1, 2)) <= 2.0 + 1e-6)  # 8 decades, scaled by 4
    assert pad_or_trim(torch.ones(5), 3).tolist() == [1, 1, 1]
    assert pad_or_trim(torch.ones(2), 4).tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("audio_samples", [1, 4_000, 43_210, 48_000 - 360, 48_000 - 200, 48_000])
def test_features_of_padded_audio_skip_the_silence_and_stay_the_same(audio_samples):
    # A recording padded with zeros to its window: the frames that read only padding are filled, not transformed,
    # and every feature is what the whole window's STFT gives, bit for bit (the edges: the last frames whose
    # reflected end reads the padding, a recording that fills the window).
    settings = LogMelSettings(window_samples=48_000)
    audio = torch.zeros(2, 48_000)
    audio[:, :audio_samples] = torch.randn(2, audio_samples, generator=torch.Generator().manual_seed(audio_samples))
    whole = log_mel_spectrogram(audio, settings)
    assert torch.equal(log_mel_spectrogram(audio, settings, audio_samples=audio_samples), whole)
    samples = audio[0, :audio_samples]
    expected = normalize_windows(whole[:1], [audio_samples], settings)[0]
    assert torch.equal(recording_features(samples, settings), expected)


# ---- per-recording normalisation (a speech model's feature_normalization) ----------------------------------------


def _tone(seconds: float, hertz: float = 440.0, level: float = 0.3, seed: int = 0) -> torch.Tensor:
    """A tone with a little noise (so no mel channel is constant) at 16 kHz."""
    time = torch.arange(int(16_000 * seconds)) / 16_000
    noise = torch.randn(time.shape[0], generator=torch.Generator().manual_seed(seed))
    return level * (torch.sin(2 * torch.pi * hertz * time) + 0.05 * noise)


def test_utterance_normalisation_centres_each_channel_and_scales_the_recording():
    settings = LogMelSettings(window_samples=16_000, normalization="utterance")  # 100 frames a window
    samples = _tone(0.6)  # 9,600 samples: frames 0-59 hold audio, 60-99 silence
    features = recording_features(samples, settings)
    assert features.shape == (80, 100)
    audio = features[:, :60]
    torch.testing.assert_close(audio.mean(dim=1), torch.zeros(80), atol=1e-5, rtol=0)  # every channel centred
    assert 0.97 < float(audio.pow(2).mean().sqrt()) < 1.0  # unit spread over the audio's frames, less the eps's share
    silence = features[:, 62:]  # frames whose 400-sample window holds no audio
    assert torch.equal(silence, silence[:, :1].expand_as(silence))  # the padding stays one column, repeated
    plain = LogMelSettings(window_samples=16_000)
    raw = log_mel_spectrogram(pad_or_trim(samples, 16_000), plain)
    spread = (raw[:, :60] - raw[:, :60].mean(dim=1, keepdim=True)).pow(2).mean().sqrt()
    expected = (raw - raw[:, :60].mean(dim=1, keepdim=True)) / (spread + NORMALIZATION_EPS)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)  # the silence moved as the audio did
    assert torch.equal(recording_features(samples, plain), raw)  # "none": Whisper's features, untouched


def test_utterance_normalisation_removes_the_recording_s_level():
    settings = LogMelSettings(window_samples=16_000, normalization="utterance")
    loud, quiet = _tone(0.8, level=0.5), _tone(0.8, level=0.02)
    plain = LogMelSettings(window_samples=16_000)
    assert (recording_features(loud, plain) - recording_features(quiet, plain)).abs().max() > 0.5  # 1.4 decades
    # float32 FFT rounding in the quietest channels, scaled by the normalisation, differs by host: within 1e-4 on
    # the AMD EPYC hosts of earlier runs, 1.6e-4 on an Intel Xeon with AVX-512; 1e-3 is 500 times below the level
    # it removes.
    torch.testing.assert_close(recording_features(loud, settings), recording_features(quiet, settings), atol=1e-3,
                               rtol=0)


def test_each_window_of_a_long_recording_is_normalised_on_its_own_audio():
    settings = LogMelSettings(window_samples=16_000, normalization="utterance")
    samples = torch.cat([_tone(1.0, 300.0), _tone(0.5, 1200.0, level=0.05, seed=1)])  # 1.5 s: two windows
    features = recording_features(samples, settings)
    assert features.shape == (80, 200)  # frames 0-99 the first window, 100-149 the second's audio, then silence
    for audio in (features[:, :100], features[:, 100:150]):
        torch.testing.assert_close(audio.mean(dim=1), torch.zeros(80), atol=1e-5, rtol=0)
        assert 0.97 < float(audio.pow(2).mean().sqrt()) < 1.0


def test_normalisation_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="normalization='global' is not one of none, utterance"):
        normalize_windows(torch.zeros(1, 80, 100), [100], LogMelSettings(window_samples=16_000,
                                                                         normalization="global"))
    with pytest.raises(ValueError, match="not whole windows of 100 frames"):
        normalize_windows(torch.zeros(1, 80, 150), [100], LogMelSettings(window_samples=16_000,
                                                                         normalization="utterance"))
