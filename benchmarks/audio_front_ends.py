"""torchaudio's Spectrogram and MelSpectrogram (power 2, centred, reflect-padded, Hann window; mel filters as
torchaudio.functional.melscale_fbanks makes them, HTK scale, no norm), rewritten from torchaudio's source with the
same TorchScript ops, for a machine where torchaudio does not install (its wheels need a CUDA torch):
benchmarks/torchscript_programs.py uses them for its spectrogram rows when torchaudio is missing."""
from __future__ import annotations

import math

import torch


class Spectrogram(torch.nn.Module):
    def __init__(self, n_fft=400, hop_length=160, power: float = 2.0):
        super().__init__()
        self.n_fft, self.win_length, self.hop_length, self.pad, self.power = n_fft, n_fft, hop_length, 0, power
        self.register_buffer("window", torch.hann_window(n_fft))
        self.normalized, self.center, self.pad_mode, self.onesided = False, True, "reflect", True

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        if self.pad > 0:
            waveform = torch.nn.functional.pad(waveform, (self.pad, self.pad), "constant")
        shape = waveform.size()
        waveform = waveform.reshape(-1, shape[-1])
        spec_f = torch.stft(input=waveform, n_fft=self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                            window=self.window, center=self.center, pad_mode=self.pad_mode, normalized=False,
                            onesided=self.onesided, return_complex=True)
        spec_f = spec_f.reshape(shape[:-1] + spec_f.shape[-2:])
        if self.power == 1.0:
            return spec_f.abs()
        return spec_f.abs().pow(self.power)


def hz_to_mel(f: float) -> float:
    return 2595.0 * math.log10(1.0 + f / 700.0)


def melscale_fbanks(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int) -> torch.Tensor:
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2)
    f_pts = 700.0 * (10 ** (m_pts / 2595.0) - 1.0)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.max(torch.zeros(1), torch.min(down, up))


class MelSpectrogram(torch.nn.Module):
    def __init__(self, sample_rate=16000, n_fft=400, hop_length=160, n_mels=80):
        super().__init__()
        self.spectrogram = Spectrogram(n_fft, hop_length)
        self.register_buffer("fb", melscale_fbanks(n_fft // 2 + 1, 0.0, float(sample_rate // 2), n_mels, sample_rate))

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        specgram = self.spectrogram(waveform)
        return torch.matmul(specgram.transpose(-1, -2), self.fb).transpose(-1, -2)

