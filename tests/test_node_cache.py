"""The node table the three facades share (:mod:`shardkv.metadata.nodes`): kept nodes, generation, owner walk."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardkv.keys.paths import chunk_owner_paths
from shardkv.metadata.nodes import NodeCache, Walked

ARRAY = "array"
GROUP = "group"


def _is_array(node: str | None) -> bool:
    return node == ARRAY


class CountingReads:
    """Node reads by path, in order, from a fixed hierarchy (path -> node; others are nothing)."""

    def __init__(self, hierarchy: dict[str, str]) -> None:
        self.hierarchy = hierarchy
        self.paths: list[str] = []

    def __call__(self, path: str) -> str | None:
        self.paths.append(path)
        return self.hierarchy.get(path)


def test_the_walk_stops_at_the_first_path_not_read_and_looks_no_further() -> None:
    cache: NodeCache[str | None] = NodeCache()
    cache.load({"": GROUP, "a/1": ARRAY})
    assert cache.walk(["", "a", "a/1"], _is_array) == Walked(unread="a")


def test_the_walk_passes_over_groups_and_nothing_and_the_first_array_decides() -> None:
    cache: NodeCache[str | None] = NodeCache()
    cache.load({"": GROUP, "a": None, "a/1": ARRAY, "a/1/2": ARRAY})
    assert cache.walk(["", "a", "a/1", "a/1/2"], _is_array) == Walked(path="a/1", node=ARRAY)
    assert cache.walk(["", "a"], _is_array) == Walked()


def test_a_chunk_of_an_array_costs_the_read_of_that_array_alone() -> None:
    reads = CountingReads({"g/arr": ARRAY, "g/arr/1": ARRAY})
    cache: NodeCache[str | None] = NodeCache()
    walked = cache.first(chunk_owner_paths("g/arr/1/2/3"), _is_array, reads)
    assert walked == Walked(path="g/arr", node=ARRAY)
    assert reads.paths == ["g/arr"]
    assert cache.first(chunk_owner_paths("g/arr/1/2/4"), _is_array, reads).node == ARRAY
    assert reads.paths == ["g/arr"]  # kept: not read again


def test_the_blocking_walk_reads_from_the_highest_path_down_until_an_array() -> None:
    reads = CountingReads({"3/0": ARRAY})
    cache: NodeCache[str | None] = NodeCache()
    walked = cache.first(chunk_owner_paths("3/0/1/2"), _is_array, reads)
    assert walked == Walked(path="3/0", node=ARRAY)
    assert reads.paths == ["", "3", "3/0"]


def test_no_owner_after_reading_every_candidate_once() -> None:
    reads = CountingReads({})
    cache: NodeCache[str | None] = NodeCache()
    assert cache.first(["", "a", "a/b"], _is_array, reads) == Walked()
    assert reads.paths == ["", "a", "a/b"]


def test_reading_a_node_keeps_the_generation_and_every_change_moves_it() -> None:
    cache: NodeCache[str | None] = NodeCache()
    cache.load({"a": ARRAY})
    assert cache.generation == 0  # what was already there: owners did not change
    changes = [
        lambda: cache.set("b", ARRAY),
        lambda: cache.forget("a"),
        lambda: cache.forget_under("b"),
        lambda: cache.forget_under(""),
    ]
    for i, change in enumerate(changes, start=1):
        change()
        assert cache.generation == i


def test_forget_under_forgets_a_path_and_its_descendants_not_its_siblings() -> None:
    cache: NodeCache[str | None] = NodeCache()
    cache.load({"": GROUP, "g": GROUP, "g/a": ARRAY, "g/a/x": None, "g/ab": ARRAY})
    cache.forget_under("g/a")
    assert cache.kept(["", "g", "g/a", "g/a/x", "g/ab"]) == {"": GROUP, "g": GROUP, "g/ab": ARRAY}
    assert cache.unread(["g/a", "g/ab", "g/a"]) == ["g/a"]
    cache.forget_under("")
    assert cache.kept(["", "g", "g/ab"]) == {}


def test_none_is_a_node_kept_like_any_other() -> None:
    cache: NodeCache[str | None] = NodeCache()
    cache.load({"a": None})
    assert cache.kept(["a"]) == {"a": None}
    assert cache.unread(["a"]) == []


@given(
    st.dictionaries(
        st.sampled_from(["", "a", "a/0", "a/0/1", "a/0/1/2"]), st.sampled_from([ARRAY, GROUP, None]), max_size=5
    ),
    st.sampled_from(["a/0/1/2/3", "a/0/1/2", "a/0/1", "a/0", "0/1"]),
)
def test_the_walk_answers_as_the_owner_rule_over_a_known_hierarchy(hierarchy: dict[str, str | None], key: str) -> None:
    arrays = {p for p, kind in hierarchy.items() if kind == ARRAY}
    expected = next((p for p in chunk_owner_paths(key) if p in arrays), None)
    cache: NodeCache[str | None] = NodeCache()
    walked = cache.first(chunk_owner_paths(key), _is_array, CountingReads({p: n for p, n in hierarchy.items() if n}))
    assert walked.path == expected
    assert walked.unread is None


def test_a_node_read_while_a_write_set_it_does_not_replace_what_the_write_set() -> None:
    cache: NodeCache[str | None] = NodeCache()

    def read(path: str) -> str | None:
        if path == "a":  # the document is written (and the facade sets the node) while this read is under way
            cache.set("a", ARRAY)
            return None  # what the read found: the state before the write
        return GROUP

    assert cache.first(["", "a"], _is_array, read) == Walked(path="a", node=ARRAY)
    assert cache.kept(["a"]) == {"a": ARRAY}


def test_a_node_read_while_a_delete_forgot_it_is_read_again_not_kept_stale() -> None:
    cache: NodeCache[str | None] = NodeCache()
    reads = CountingReads({"": GROUP})

    def read(path: str) -> str | None:
        if path == "a" and "a" not in reads.paths:  # the array is deleted (and forgotten) while it is read
            reads.paths.append(path)
            cache.forget_under("a")
            return ARRAY  # what the read found: the state before the delete
        return reads(path)

    assert cache.first(["", "a"], _is_array, read) == Walked()
    assert reads.paths == ["", "a", "a"]
    assert cache.kept(["a"]) == {"a": None}
