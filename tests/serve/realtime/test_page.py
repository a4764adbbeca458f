"""The page at `/`, in a real browser: Debian's Chromium, headless, its microphone a fake capture of a WAV file,
driven by Playwright (never Playwright's own browser download). It talks to the server over `/v1/realtime`;
audio must come back and the transcript fill."""

from __future__ import annotations

import shutil
import wave

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]

pytestmark = [
    pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed"),
    pytest.mark.slow,
]


def write_speech_like(path, rate=48000, seconds=4.0):
    """A WAV file of tones for the fake microphone."""
    times = np.arange(int(rate * seconds)) / rate
    signal = 0.3 * np.sin(2 * np.pi * 220 * times) * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * times))
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((signal * 32767).astype("<i2").tobytes())


def talk(url, capture, tmp_path, until="window.duplexcadence.units >= 4", timeout_ms=90_000):
    """Open the page at `url` in Chromium with `capture` as its microphone, press Start, wait for `until`; the
    page's state (`window.duplexcadence`) and its transcript as shown."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=[*FLAGS, f"--use-file-for-fake-audio-capture={capture}"]
        )
        try:
            page = browser.new_page()
            page.goto(url)
            page.click("#start")
            page.wait_for_function(until, timeout=timeout_ms)
            return page.evaluate("window.duplexcadence"), page.inner_text("#transcript"), page.inner_text("#units")
        finally:
            browser.close()


def test_the_page_talks_to_the_model_and_plays_its_answer(engine_server, tmp_path):
    engine_server.idle()
    capture = tmp_path / "speech.wav"
    write_speech_like(capture)
    state, transcript, units = talk(
        engine_server.url(f"/?script=1&seed=5&units=3&key={engine_server.key}"),
        capture,
        tmp_path,
        until="window.duplexcadence.units >= 3 && window.duplexcadence.audioSamples > 0",
        timeout_ms=400_000,
    )
    assert state["errors"] == []
    assert state["session"]["audio"]["input"]["format"]["rate"] != 16000  # the page's capture rate, resampled
    assert state["audioSamples"] == state["unitAudioSamples"] > 0  # every sample the units made was played
    assert transcript.strip() == state["unitText"] and state["unitText"].startswith("<11><12><13>")
    assert "speak" in units and "listen" in units
