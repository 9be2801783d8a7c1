"""The tracing tests of `test_tracing`, run against the lean provider (`subagent.lean_tracing`)
the runtime installs for a supported `OTEL_*` set-up: the same tree, parentage, attributes,
events, links and status through the OpenTelemetry API, with lean spans behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_tracing import (  # noqa: F401  (collected here again, under the lean provider)
    test_a_later_turn_with_no_parent_keeps_the_agents_previous_one,
    test_a_resumed_acp_childs_activation_links_to_its_first,
    test_a_turn_parented_from_another_process_is_a_server_span,
    test_aborted_parallel_children_end_every_span,
    test_an_acp_childs_spans_join_the_trace_through_meta,
    test_captured_output_is_the_repaired_reply,
    test_chat_input_tokens_include_cached_input_as_the_genai_convention_counts_them,
    test_chat_spans_carry_usage_and_tools_see_their_span_as_current,
    test_output_is_not_captured_unless_asked,
    test_the_demo_tree_is_one_trace_with_the_right_parentage,
)
from tracing_support import flavour


@pytest.fixture(autouse=True)
def _lean() -> Iterator[None]:
    with flavour("lean"):
        yield
