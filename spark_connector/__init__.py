"""PySpark data source ``ketten``: read replicated chains as DataFrames.

Batch and streaming reads of the chains held in node store directories
(``sqlite``, ``file`` or any store plugin implementing
``ketten_open_store_reader``) or fetched from live peers::

    from ketten.spark import local_session

    spark = local_session()                      # local[2], source registered
    df = (spark.read.format("ketten")
          .option("paths", "/data/node-a,/data/node-b,/data/node-c")
          .option("criteria", "orders,payments")
          .load())
    df.groupBy("criterion", "author").count().show()

    spark.sql("CREATE TEMP VIEW events USING ketten OPTIONS (path '/data/node-a')")

    (spark.readStream.format("ketten").option("path", "/data/node-a")
     .option("maxEventsPerTrigger", 100000).load()
     .writeStream.trigger(availableNow=True)
     .option("checkpointLocation", "/chk/events").toTable("events"))

Columns
-------
==============  =========  ======================================================
column          type       meaning
==============  =========  ======================================================
``criterion``   string     criterion key, 64 lowercase hex digits
                           (``sha2('orders', 256)`` in SQL is the key of ``orders``)
``name``        string     the criterion's name where the query gives it (the
                           ``criteria`` option, or a filter ``name = 'orders'`` /
                           ``name IN (...)``, which selects that chain); else
                           null: stored events carry only keys
``seq``         long       height in the chain, 0 = genesis
``hash``        string     event hash (hex)
``prev``        string     hash of the predecessor (hex); null for a genesis
``author``      string     author's Ed25519 public key (hex)
``command``     long       the author's command id, or null
``clock``       binary     logical clock stamp (encoding of the clock plugin)
``time``        timestamp  author's wall clock (informational); null if beyond 9999
``payload``     binary     application payload
``replicas``    int        how many of the replicas read hold this very event here
``orphan``      boolean    only with ``includeOrphans``: event off the read branch
==============  =========  ======================================================

Identifiers are hex strings so that they can be shown, joined and filtered
in SQL; ``unhex(criterion)`` gives the 32 raw bytes. Opaque data (``clock``,
``payload``) is binary, as in the Kafka source.

Spark does not tell a Python data source which columns a query uses, so a
read produces every column unless its schema says otherwise: give the reader
the columns you need, with their types from the table above, in any order
(column pruning by hand)::

    spark.read.format("ketten").schema("author string, seq long").load(path)

Only those columns are handed to Spark, which is what costs most per row.
With ``verify`` ``none`` and no column besides ``criterion``, ``name`` and
``seq``, no event is read at all: the rows come from the chains' heads
(``count()`` of a chain, or of every chain, answered from metadata). A
column that can be null cannot be declared ``NOT NULL``; a column the source
does not have, or one of another type, is refused with an error naming it.

Options (names are case-insensitive)
------------------------------------
=========================  ===========  ==================================================
option                     default      meaning
=========================  ===========  ==================================================
``path`` / ``paths``       --           store directories, comma-separated or a JSON
                                        array (``load(path)`` also works). Several
                                        directories are replicas of the same chains:
                                        they are reconciled (the branch most replicas
                                        hold wins, ties to the longer, then the lower
                                        head hash) and ``replicas`` counts agreement.
``peers``                  --           live peers (``host:port``, tcp transport) to
                                        copy the chains from at ``load()`` (streams:
                                        at every trigger); each peer counts as a
                                        replica. Needs ``criteria`` or ``keys``.
``criteria``               all chains   criterion names; hashed with
                                        ``ketten.criterion_key``
``keys``                   all chains   criterion keys as hex (combined with ``criteria``)
``startingSeq``            0            first seq read (inclusive); for streams, where
                                        chains start that the checkpoint does not know
``endingSeq``              head         seq to stop before (exclusive); batch only
``verify``                 ``links``    ``links``: structure, hash links, heights and
                                        criterion; ``full``: also signatures and the
                                        writer policy; ``none``: structure only
``includeOrphans``         false        also list events that lost a fork (stored
                                        orphans, and diverged replicas' events) with
                                        ``orphan = true``; batch only
``skipDamaged``            false        a chain failing verification is read up to its
                                        last verified event, reported (log warning
                                        ``ketten.spark``; ``damagedPath``) and the read
                                        goes on; each chain is then read by one task.
                                        Otherwise the read fails with
                                        :class:`DamagedChain` naming criterion and seq.
``damagedPath``            --           with ``skipDamaged``: directory that receives
                                        one JSON report per damaged chain (criterion,
                                        seq, path, error); ``spark.read.json`` reads it
``maxEventsPerPartition``  250000       events per Spark task; longer chains are split
                                        into seq ranges, short ones grouped
``maxEventsPerTrigger``    unlimited    streams: events per micro-batch, shared among
                                        chains in proportion to what they have pending
``startingOffsets``        earliest     streams without a checkpoint: ``earliest`` or
                                        ``latest`` (only events appended from now on)
``batchRows``              8192         rows per Arrow record batch
``peerTimeout``            10           seconds to wait for a peer's answer
``peerStore``              sqlite       store plugin for the copies of peers' chains
``peerDirectory``          temporary    where those copies live; reuse it to make
                                        later reads fetch only what is new
``replication``            3            the network's ``r`` (checked in the handshake)
``puzzleDifficulty``       0            the network's id-puzzle difficulty
=========================  ===========  ==================================================

Filters on ``criterion``, ``name`` and ``author`` (``=``, ``IN``) and on
``seq`` and ``time`` (``=``, ``<``, ``<=``, ``>``, ``>=``) are pushed into the
source and applied exactly: only the chains and seq ranges asked for are
read, and only the rows of the authors and times asked for reach Spark
(stores keep no index by author or time, so their chains are still read)
(Spark 4.1+ with
``spark.sql.python.filterPushdown.enabled``, which :func:`local_session`
sets; see :func:`register` for a Spark issue with reused DataFrames).

Nothing is silently empty by mistake: an unknown option, a store path that
does not exist, a criterion of ``criteria``/``keys`` that none of the
sources holds (batch reads; a stream waits for it), and a filter
``criterion = 'orders'`` (a name where the column holds keys) raise
:class:`~ketten.errors.UsageError` naming the problem.

Streaming offsets are ``{criterion hex: height}`` JSON objects with sorted
keys. ``trigger(availableNow=True)`` reads what exists when the query
starts, in ``maxEventsPerTrigger`` steps, and stops; a restarted query goes
on from its checkpoint.

Cluster use
-----------
Every Spark worker needs ``pip install ketten[spark]`` (the connector, the
store plugins and pyarrow) in the Python that ``spark.pyspark.python``
names, and the store directories (or the peers) must be reachable from the
workers at the same paths; the driver plans from the same directories.
Register the source once per session with :func:`register`. Copies of
peers' chains are written on the driver: on a cluster, point
``peerDirectory`` at a shared filesystem.

The workers decode stored events with a small C module that the install
builds where a C compiler and Python's headers are present (SHA-256 comes
from the libcrypto that ``hashlib`` uses). Without it the install still
succeeds and a numpy decoder, accepting exactly the same encodings, does
the work (its decoding step takes about 2.5 times as long);
:data:`COMPILED_DECODER` tells which one a Python uses.
"""

from ._decode import COMPILED as COMPILED_DECODER
from ._scan import DamagedChain
from ._session import local_session, register
from ._source import KettenDataSource

__all__ = ["COMPILED_DECODER", "DamagedChain", "KettenDataSource", "local_session", "register"]
