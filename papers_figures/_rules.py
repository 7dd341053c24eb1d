"""The report's own decision rules, beyond tgsim.analysis.verdicts, as pure functions of numbers: each
figure script that uses one calls it, and tests/test_report_claims.py tests each on either side of
its threshold.

`no_loss_verdict(r)`        an accuracy sentence with no tolerance ("does not incur any accuracy loss"):
                            a non-inferiority result at margin 0 can be at best "inconclusive" (fig08,
                            fig11; `accuracy_verdict` applies it wherever a sentence's margin is 0).
`averaging_verdict(lo, hi)` "a biased codec's error does not average out" (fig07), judged on the
                            relative error's slope against log N.
`speedup_row_verdict(...)`  which verdict a fig09 row gets before any slope is compared (not run, no
                            range, the same runs as fp32's, no claim, never reached ε).
`speed_gain_verdict(...)`   fig11's "significant speed gains" on one model: judged only where the best
                            float's step has communication to save (SPEED_ROOM_MIN), else "n/a".
`spread_checked(r)`         fig03: a setting's t-test result whose usable pairs have no spread (all gaps
                            equal, a zero-width interval) is "inconclusive", not decided.
`diverged_note(...)`        fig03's note when a "not confirmed" rests on diverged runs only;
`diverged_summary(...)`     its few words beside the verdict in the summary (the runs named, the verdict
                            without them).
"""

from __future__ import annotations

import math

from tgsim.analysis.verdicts import combine, interval_verdict

# -- "does not incur any accuracy loss" (margin 0) -----------------------------------------------------------
NO_LOSS_RULE = ("margin 0 (the sentence gives no tolerance): a non-inferiority test at margin 0 confirms only "
                "a method significantly better than fp32, which tests the sentence's other half (\"can even "
                "improve accuracy\"), not \"no loss\"; so the verdict is at best inconclusive (not contradicted: "
                "the 90 % interval printed), and not confirmed when the whole interval lies below 0 (a loss "
                "shown at alpha 0.05) or the method diverged")


def no_loss_verdict(r: dict) -> dict:
    """A `tgsim.analysis.verdicts.noninferiority` result at margin 0, judged as NO_LOSS_RULE says: `r`
    with `verdict` "not confirmed" (a loss shown: the interval's upper end below 0, or the method
    diverged) or "inconclusive" (everything else, even an interval above 0), and `reading`: "loss
    shown", "diverged", "not contradicted" or "not contradicted; better than fp32 (can even improve)"."""
    lo, hi = r.get("lo", math.nan), r.get("hi", math.nan)
    if r.get("failed"):
        return dict(r, verdict="not confirmed", reading="diverged")
    if math.isfinite(hi) and hi < 0:
        return dict(r, verdict="not confirmed", reading="loss shown")
    if math.isfinite(lo) and lo > 0:
        return dict(r, verdict="inconclusive", reading="not contradicted; better than fp32 (can even improve)")
    return dict(r, verdict="inconclusive", reading="not contradicted" if math.isfinite(lo) else "no interval")


def accuracy_verdict(r: dict, margin_points: float) -> dict:
    """The verdict of an accuracy sentence with margin `margin_points`: `no_loss_verdict` at margin 0,
    the non-inferiority result `r` itself otherwise (a stated tolerance such as "less than 2%")."""
    return no_loss_verdict(r) if margin_points == 0 else r


# -- "a biased codec's error does not average out" (fig07) ---------------------------------------------------
AVERAGING_FLOOR = -0.1
AVERAGING_RULE = (f"judged on the relative error E||mean Q - mean v||² / ||mean v||² (the error as a share of the "
                  f"mean gradient it estimates, the quantity of panels (a)-(e)): the slope of its log on log N, 95 % "
                  f"t-interval over seeds; an error that averages out falls with N, one that does not stays a fixed "
                  f"share (slope 0). Threshold {AVERAGING_FLOOR:g}: over N = 1..32 a slope of {AVERAGING_FLOOR:g} "
                  f"removes {100 * (1 - 32 ** AVERAGING_FLOOR):.0f} % of the relative error (32^{AVERAGING_FLOOR:g} = "
                  f"{32 ** AVERAGING_FLOOR:.2f}), far less than averaging removes from an unbiased code's (printed "
                  f"beside it). Interval above {AVERAGING_FLOOR:g}: confirmed (does not average out); below: not "
                  f"confirmed (it averages out); across: inconclusive. Not the absolute error: ||mean v||² itself "
                  f"shrinks with N here (independent noise per worker), so the absolute error falls even where the "
                  f"relative error rises")


def averaging_verdict(lo: float, hi: float, floor: float = AVERAGING_FLOOR) -> str:
    """AVERAGING_RULE on the interval [lo, hi] of the relative error's slope on log N: above `floor`
    "confirmed" (the error does not average out), below it "not confirmed", across it "inconclusive"."""
    return interval_verdict(lo, hi, low=floor)


# -- fig09: a row's verdict before its slope is compared ---------------------------------------------------
def speedup_row_verdict(*, run: bool, has_range: bool, same_as_reference: bool, reached: int, runs: int,
                        slope_verdict: str | None = None, claim: bool = True) -> tuple[str, str]:
    """(verdict, why) of a fig09 row about one method, in this order: not in the run, "n/a"; no claim
    (a row that answers a question), "n/a"; fp32 has no linear range, "untestable here"; the method's K
    equals fp32's on every run (it compressed nothing here), "n/a"; it reached ε on none of its `runs`
    runs over the range (`reached` 0), "not confirmed" (its failure, as fig08 counts a missed target);
    otherwise `slope_verdict` (keeps_speedup's), "slope"."""
    if not run:
        return "n/a", "not run"
    if not claim:
        return "n/a", "no claim: an answer to a question"
    if not has_range:
        return "untestable here", "no linear range"
    if same_as_reference:
        return "n/a", "the same runs as fp32's: nothing compressed to test"
    if runs and not reached:
        return "not confirmed", "missed ε on every run: its failure"
    return (slope_verdict or "inconclusive"), "slope"


# -- fig11: "significant speed gains" where there is communication to save ---------------------------------
SPEED_ROOM_MIN = 1.1
SPEED_ROOM_RULE = (f"judged only where the best float's step has communication to save: its room, "
                   f"t_step / (t_step - exposed_comm), the speedup at equal steps K if the code cost nothing and "
                   f"sent nothing, at least {SPEED_ROOM_MIN:g} (exposed communication at least "
                   f"{100 * (1 - 1 / SPEED_ROOM_MIN):.1f} % of the step; fig06's minimum growth); below it the "
                   f"time ratio is the ratio of steps K and the codec's own cost, not a gain from fewer bits, and "
                   f"the model gets no verdict (n/a, its ratio shown)")


def speed_gain_verdict(lo: float, hi: float, t_step: float, exposed_comm: float,
                       min_room: float = SPEED_ROOM_MIN) -> tuple[str, float]:
    """(verdict, room) of "significant speed gains" on one model (SPEED_ROOM_RULE): room = t_step /
    (t_step - exposed_comm) of the best float at the judged N (inf when its step is all communication,
    nan when unknown); room < `min_room` (or unknown) gives "n/a"; otherwise the speedup's interval
    [lo, hi] against 1 (interval_verdict: above "confirmed", below "not confirmed", across
    "inconclusive")."""
    rest = t_step - exposed_comm
    room = (math.inf if rest <= 0 else t_step / rest) if math.isfinite(t_step) and math.isfinite(exposed_comm) \
        else math.nan
    if not room >= min_room:
        return "n/a", room
    return interval_verdict(lo, hi, low=1.0), room


# -- fig03: no decision from a zero-width interval ------------------------------------------------------------
def spread_checked(r: dict) -> dict:
    """A `tgsim.analysis.verdicts` t-test result `r` (equivalence, non-inferiority) with its verdict
    "inconclusive" where its usable pairs have no spread (sd 0 up to rounding, 1e-9 of the gap: every
    gap equal, e.g. two pairs left after a reference's divergence, on a test set whose accuracy moves
    in steps) and it was decided on that interval; a method's own failure (r["failed"]) keeps its
    verdict. `reading` says why."""
    sd, diff = r.get("sd", math.nan), r.get("diff", math.nan)
    if r.get("failed") or r.get("verdict") not in ("confirmed", "not confirmed") or not (
            math.isfinite(sd) and sd <= 1e-9 * max(1.0, abs(diff) if math.isfinite(diff) else 1.0)):
        return r
    return dict(r, verdict="inconclusive", reading=f"no spread over its {r.get('n')} usable pair(s): a zero-width "
                                                    "interval decides nothing")


# -- fig03: a "not confirmed" that rests on diverged runs ------------------------------------------------------
def diverged_note(settings: list[dict], n_runs: int) -> str:
    """fig03's note on a joint verdict (`combine(..., every=True)` of the settings) that is "not
    confirmed" only through diverged runs: every setting judged "not confirmed" is one where the method
    diverged (`failed` > 0). Each setting: dict(label, verdict, failed, finite_verdict: the verdict of its
    finite runs alone, optionally finite_n: how many seeds those are). The note names how many runs
    diverged of `n_runs`, where, and the joint verdict with the diverged runs left out; "" when the joint
    verdict is not "not confirmed" or some setting refutes it on finite runs."""
    verdicts = [s["verdict"] for s in settings]
    failed = [s for s in settings if s["failed"]]
    if combine(verdicts, every=True) != "not confirmed" or not failed \
            or verdicts.count("not confirmed") != len(failed):
        return ""
    k = sum(s["failed"] for s in failed)
    without = combine([s["finite_verdict"] if s["failed"] else s["verdict"] for s in settings], every=True)
    return (f"'not confirmed' rests on {k} diverged run(s) of {n_runs} ("
            + ", ".join(f"{s['label']}: {s['failed']}" for s in failed)
            + f"); with them left out, the finite runs give "
            + ", ".join(f"{s['label']} {s['finite_verdict']}"
                        + (f" (on {s['finite_n']} seed(s))" if s.get("finite_n") is not None else "") for s in failed)
            + f" and the claim {without}")



def diverged_summary(settings: list[dict], diverged: list[dict], n_runs: int) -> str:
    """The summary's words beside a joint verdict that `diverged_note` explains (else ""): "not confirmed: K of
    `n_runs` runs diverged (each run of `diverged`: dict(workers, optimizer, seed)); V without it/them", V the
    joint verdict with the diverged runs left out."""
    if not diverged_note(settings, n_runs):
        return ""
    without = combine([s["finite_verdict"] if s["failed"] else s["verdict"] for s in settings], every=True)
    return (f"not confirmed: {len(diverged)} of {n_runs} runs diverged ("
            + "; ".join(f"N = {r['workers']}, {r['optimizer']}, seed {r['seed']}" for r in diverged)
            + f"); {without} without " + ("it" if len(diverged) == 1 else "them"))
