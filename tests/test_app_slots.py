"""Decoding slots (app/slots.py): first come first served, and a waiting visitor's estimate measured from past holds."""
import time

from app.slots import Slots


def test_slots_serve_in_order_and_estimate_from_measured_holds(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    slots = Slots(2)
    a, b, c, d = (slots.ticket() for _ in range(4))
    assert slots.try_take(a) and slots.try_take(b)
    assert not slots.try_take(d)  # c is first in line
    assert not slots.try_take(c)  # both slots are taken
    assert slots.waiting(c) == (2, None) and "no decode measured" in slots.note(c)
    clock[0] += 10
    slots.release(a)  # held 10 s
    assert slots.try_take(c) and not slots.try_take(d)
    clock[0] += 4  # b has run 14 s, c 4 s: a mean hold of 10 s frees b now and c in 6 s
    assert slots.waiting(d) == (2, 0.0)
    e = slots.ticket()
    assert slots.waiting(e) == (3, 6.0)  # d takes b's slot now (for 10 s); e gets c's in 6 s
    assert "about 6s (measured from the last 1 decodes here)" in slots.note(e)
    slots.release(e)  # a visitor who leaves the line
    slots.release(b)
    assert slots.try_take(d) and slots.waiting(d) == (0, 0.0)


def test_a_free_slot_is_free_now_and_each_kind_has_its_own_mean(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    slots = Slots(2)
    for kind, hold in (("run", 30.0), ("step", 2.0)):
        t = slots.ticket(kind)
        assert slots.try_take(t)
        clock[0] += hold
        slots.release(t)
    run = slots.ticket("run")
    assert slots.try_take(run)  # one Run holds a slot, the other is free
    first, second = slots.ticket("step"), slots.ticket("run")
    assert slots.waiting(first) == (1, 0.0)  # the free slot is the first in line's at once
    assert slots.waiting(second) == (2, 2.0)  # then it frees after the Step's 2 s, before the Run's 30 s
    clock[0] += 10
    assert slots.waiting(second) == (2, 2.0)
