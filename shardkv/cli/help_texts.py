"""The long help texts and examples of the ``shardkv`` sub-commands (plain text, no logic)."""

from __future__ import annotations

EXAMPLES = """\
examples:
  shardkv demo                                            # a small example, end to end, in a temporary directory
  shardkv convert data/in.zarr data/sharded.zarr --chunks-per-shard 4
  shardkv convert data/in.zarr s3://bucket/out.zarr --chunks-per-shard 2,2,1 --workers 4 \\
      --dest-storage-options '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}'
  shardkv unshard data/sharded.zarr data/plain.zarr       # back to plain Zarr v2 chunks
  shardkv info data/sharded.zarr --json
  shardkv compact data/sharded.zarr                       # reclaim unused bytes inside shards
  shardkv verify data/sharded.zarr --decode               # check every shard; exit status 1 on damage

Stores are local paths or fsspec URLs (s3://, gs://, az://, memory://, ...); --storage-options
passes fsspec options (endpoint, credentials) as JSON. A bucket is never created.
"""

CONVERT_HELP = """\
Copy a Zarr v2 hierarchy, packing the chunks of every array into shards (v1.0
sharding_indexed layout) without decoding or re-encoding a chunk. Each sharded
array is stored as a Zarr v3 array and nothing else: its zarr.json (attributes
inside) replaces its .zarray and .zattrs, and the groups above it become v3
groups; shardkv.ShardedStore presents them to zarr-python 2 as before, and
zarr-python 3 and tensorstore read them without shardkv. Unsharded arrays (and
their .zarray/.zattrs) and other files are copied as they are; a consolidated
.zmetadata is rewritten so that zarr-python 2 without shardkv cannot misread a
sharded array. Chunks outside an array's grid are skipped and counted. An
array stored with '/' chunk keys but no dimension_separator in .zarray
(zarr-python's NestedDirectoryStore) is detected, and its sharded form keeps
the '/' separator.

Nothing is dropped: an array whose sharded form shardkv could not read back (an
object or string dtype) is copied unsharded, and the report says why; an array
or group named like shardkv's own files (names containing '.shardkv-tmp-', or
'.shardkv-locks') is refused; the finished output is checked to hold every
array and group of the source. --chunks-per-shard 1 gains nothing (one chunk
per shard): it is done, with a warning.

Memory stays bounded whatever the number of chunks: the source is listed
array by array as a stream (one bit per chunk kept), and only the shards in
flight are held (a few per worker).

Once an array is sharded, the output is the hierarchy shardkv.ShardedStore
would have written: Zarr v3 all the way down. Every group becomes a v3 group
(zarr.json, attributes inside) and every unsharded array gets a zarr.json that
reads its chunk objects where they are (regular chunk grid of its v2 chunks, v2
chunk key encoding with its separator, its compressor and filters as v3
codecs) beside its kept .zarray/.zattrs: zarr-python 3 and xarray opening the
root find every node, zarr-python 2 reads the unsharded arrays as before. An
array whose data type no v3 reader decodes (structured, object) gets no
zarr.json; the report names it as zarr 2 only, with the reason. The finished
output is checked the way a zarr-python 3 reader opens it: every node of the
source reached from the root, or named. Later edits of an unsharded array's
.zarray/.zattrs through zarr 2 without shardkv do not update its zarr.json.

With no array sharded, the output stays the Zarr v2 hierarchy it was (zarr-python
3 reads it as v2), unless --all-v3: then every array and group also gets a
zarr.json, their .zarray/.zattrs/.zgroup kept beside them, so zarr-python 2
and 3 both read every node without shardkv.

A Zarr v3 hierarchy (a root zarr.json: zarr-python 3's, tensorstore's) is
sharded the same way: each stored chunk becomes an inner chunk byte for byte,
the array's whole codec chain (transpose included) its inner codecs, under the
chunk key encoding it had (default '/' or '.', v2); fill value, attributes and
dimension_names are kept, groups and consolidated metadata follow. An array
already sharded is resharded: its inner chunks move to shards of
--chunks-per-shard inner chunks, located through its shard indexes (another
inner chunk shape would re-encode: not done). 0-d arrays and arrays with codecs
on whole shards are copied as they are, with the reason.

Shards are written by shard-aligned tasks (whole shards each, so no two tasks
touch one shard): in this process, in N local processes (--workers N), or on a
dask.distributed cluster (--scheduler ADDRESS). A progress manifest in DST
records finished shards: after an interruption (Ctrl-C, a crash, a killed
process), run the same command again and it skips them (checking the last ones
recorded). The manifest is removed when the conversion completes. Killing the
main process ends its worker processes too.

Progress goes to stderr when stderr is a terminal; --progress shows it anyway
(a log file), --no-progress never.

A 2022-draft Zarr v3 hierarchy (root zarr.json of the draft protocol,
meta/root/..., data/root/...) is converted into a draft-sharded copy instead:
each array's metadata gets the sharding storage transformer, and shards use
the draft's fixed "indexed" layout (index at the end, no checksum), so
--index-location start and --no-checksum are refused for such a source.
"""

CONVERT_EXAMPLES = """\
examples:
  shardkv convert in.zarr out.zarr --chunks-per-shard 4        # 4 chunks along every dimension
  shardkv convert in.zarr out.zarr --chunks-per-shard 2,2,1    # 3-d arrays only; others copied unsharded
  shardkv convert in.zarr out.zarr --chunks-per-shard 2,2 --skip-mismatched   # even if no array is 2-d
  shardkv convert in.zarr out.zarr --chunks-per-shard 8 --index-location start --no-checksum
  shardkv convert in.zarr out.zarr --chunks-per-shard 4 --overwrite
  shardkv convert in.zarr out.zarr --chunks-per-shard 4 --workers 4            # re-run it after a crash to resume
  shardkv convert s3://bucket/in.zarr s3://bucket/out.zarr --chunks-per-shard 4 --scheduler tcp://10.0.0.5:8786
  shardkv convert in.zarr s3://bucket/out.zarr --chunks-per-shard 4 \\
      --dest-storage-options '{"key": "...", "secret": "...", "client_kwargs": {"endpoint_url": "https://minio:9000"}}'
"""

UNSHARD_HELP = """\
The inverse of convert: copy a hierarchy whose arrays are sharded (v2 arrays
with a sharding zarr.json, as shardkv writes them) into a plain Zarr v2
hierarchy that zarr-python 2 reads without shardkv. Each inner chunk is copied
as stored (never decoded) to its own chunk key; the zarr.json views are
dropped; every other key is copied as it is. Like convert, it records finished
shards in a progress manifest in DST: after an interruption, run the same
command again to resume. --progress / --no-progress as for convert.

--zarr-format 3 writes plain Zarr v3 from a Zarr v3 hierarchy instead, as
zarr-python 3 writes an array by default: one object per inner chunk at
'default' keys (c/0/0), the inner chunk shape as the chunk grid and the inner
codecs as the array's codecs (the zarr.json rewritten so).
"""

UNSHARD_EXAMPLES = """\
examples:
  shardkv unshard sharded.zarr plain.zarr
  shardkv unshard sharded.zarr plain-v3.zarr --zarr-format 3
  shardkv unshard s3://bucket/sharded.zarr plain.zarr --source-storage-options '{"anon": true}'
"""

INFO_HELP = """\
Per array: path, shape, chunks, shard shape (or "unsharded"), chunks present,
shards, bytes stored (shards or chunks, metadata excluded), bytes unused inside
shards (shard bytes - index bytes - bytes of present chunks) and, in the "v3
view" column, what zarr-python 3 opening the hierarchy at its root does with
the array: "yes" (it reads it; "yes; other v3 readers: ..." names what
tensorstore and the like refuse), "no: <why>", or "as Zarr v2" when the root
is Zarr v2 (zarr-python 3 reads the whole hierarchy as v2).
Reads Zarr v2 hierarchies (sharded by shardkv or not), 2022 draft hierarchies
(sharding storage transformer) and Zarr v3 hierarchies (written by zarr-python
3, tensorstore, ...): every array is counted, sharded or not.
"""

INFO_EXAMPLES = """\
examples:
  shardkv info data/sharded.zarr
  shardkv info s3://bucket/out.zarr --json --storage-options '{"anon": true}'
"""

COMPACT_HELP = """\
Rewrite every shard of the sharded arrays in STORE (or of one array) that holds
bytes no index entry references, leaving chunks back to back and the index in
place. Such bytes are chunks replaced and indexes left by updates of a few
chunks (shard_updates: a clone where files clone, or "append"), or gaps other
writers left. First, an append to a shard that its writer left unfinished
(killed, power lost) is finished if all its bytes are there, else undone (the
shard cut back to its size before the append); on a local directory, the
temporary files of writers that no longer run are removed. The data is
unchanged; each shard is replaced whole (atomically on local disks).
STORE is any layout info reads: Zarr v2 or v3 sharded arrays (also below a root
without a group document, as tensorstore writes them) or a 2022 draft hierarchy
with the sharding storage transformer. A missing store, or an --array that is
not a sharded array, is an error.
--progress shows a bar (one step per array) on stderr even when it is not a
terminal (a log file); --no-progress never; default: only on a terminal.
"""

COMPACT_EXAMPLES = """\
examples:
  shardkv compact data/sharded.zarr
  shardkv compact data/sharded.zarr --array temp
"""

DEMO_HELP = """\
Create a small Zarr v2 hierarchy (with zarr-python 2 if installed, else with
numpy), convert it with --chunks-per-shard 4, print the summary and the info
table, and read the arrays back through ShardedStore to show they equal the
input. Runs in a temporary directory (removed at the end) unless --out OUT
(files kept in OUT/input and OUT/sharded) or DIR (input in DIR, sharded copy in
DIR/../sharded) is given. Never writes into the current directory by itself.
"""

DEMO_EXAMPLES = """\
examples:
  shardkv demo
  shardkv demo --out /tmp/shardkv-demo
"""
