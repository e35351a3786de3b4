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
    assert slots.waiting(e) == (3, 6.0)  # one ahead in line: the second slot to free
    assert "about 6s (measured from the last 1 decodes here)" in slots.note(e)
    slots.release(e)  # a visitor who leaves the line
    slots.release(b)
    assert slots.try_take(d) and slots.waiting(d)[0] == 0
