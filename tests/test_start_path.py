"""The start path's shortcuts, seen from the seam: a parked child has no actor-loop greenlet
until something has to queue for it, and a steer to an idle child is accepted (logged
`inbox/accepted`) before `steer()` returns, with no hub switch in between."""

from __future__ import annotations

from seam_kit import Gate, blocking_tool, kit, wait_until

from agent.models import scripted as S
from subagent.service import SteerableRunHandle


def test_a_parked_child_has_no_loop_greenlet_and_takes_a_steer_in_place() -> None:
    with kit() as k:
        gate = Gate()
        k.runtime.ctx.tools.register(blocking_tool("wait", gate))

        def respond(request: object) -> S.Step:
            messages = getattr(request, "messages", [])
            if getattr(request, "step", 1) > 1 and messages[-1]["role"] == "user":
                return S.text("steered")
            return S.tool_call("wait", {})

        k.respond = respond  # type: ignore[assignment]
        parent = k.parent()
        run = k.start(parent)
        assert isinstance(run, SteerableRunHandle)
        wait_until(gate.reached.is_set)
        actor = run.local_agent.actor
        assert actor._greenlet is None  # nothing ever had to queue for it
        events = run.local_agent.log.events
        before = len(events)
        admitted = run.steer("wrap up")
        # Accepted in place: logged before steer() returned, no switch to the child's loop.
        accepted = [e for e in events[before:] if e["type"] == "inbox/accepted"]
        assert [e["data"]["kind"] for e in accepted] == ["steer"]
        assert actor._greenlet is None
        gate.open()
        assert admitted.get(timeout=5) == accepted[0]["data"]["message_id"]
        assert run.result.get(timeout=5).output == [{"type": "text", "text": "steered"}]
        run.dispose()  # a dispose must queue (it waits for the close): the loop starts for it
        assert not actor.actor_ref.is_alive()
