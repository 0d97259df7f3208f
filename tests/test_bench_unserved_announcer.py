"""benchmarks.unserved_announcer, briefly: both codes' sender books run the same steps and the report lists both."""

from __future__ import annotations

import json

from benchmarks import unserved_announcer


def test_both_codes_run_the_steps_and_the_ghost_is_struck_here(tmp_path):
    data = unserved_announcer.main(["--base", "HEAD", "--steps", "30", "--output-dir", str(tmp_path)])
    results = data["results"]
    assert set(results) == {"base HEAD", "this tree"}
    here = results["this tree"]
    assert here["honest_fetched"] == here["honest_published"] == 30 and here["honest_strikes"] == 0
    assert here["ghost_strikes"] >= 1 and here["ghost_asked"] < 30  # struck, then resting: not asked every step
    page = (tmp_path / "unserved_announcer.md").read_text()
    assert "| base HEAD |" in page and "| this tree |" in page
    assert json.loads((tmp_path / "unserved_announcer.json").read_text())["steps"] == 30
