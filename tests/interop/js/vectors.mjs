// Builds the block of each ketten event with the IPLD reference libraries and
// prints its CID: the test vectors of tests/interop/vectors.json.
//
//   node vectors.mjs EVENTS.json > ../vectors.json
//
// EVENTS.json is a JSON array of {"name", "event"} (the event's canonical
// ketten CBOR in hex), the events of one chain from its genesis in seq order.
// Each event is decoded with @ipld/dag-cbor (a ketten event is an 11-element
// array), laid out as the block map of sdk/_core/ipld.py, its `prev` linking
// the CID of the block before it, and encoded; the CID is CIDv1 dag-cbor
// sha2-256 of the block.
import fs from 'node:fs'
import * as dagCbor from '@ipld/dag-cbor'
import { CID } from 'multiformats/cid'
import { sha256 } from 'multiformats/hashes/sha2'
import { fromHex, toHex } from 'multiformats/bytes'

const events = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
const vectors = []
let prev = null
for (const { name, event } of events) {
  const [version, criterion, seq, prevHash, author, command, clock, time, payload, writers, sig] =
    dagCbor.decode(fromHex(event))
  const block = dagCbor.encode({
    version, criterion, seq, prev, prevHash, author, command, clock, time, payload, writers, sig
  })
  const cid = CID.create(1, dagCbor.code, await sha256.digest(block))
  vectors.push({ name, event, prev: prev ? prev.toString() : null, block: toHex(block), cid: cid.toString() })
  prev = cid
}
console.log(JSON.stringify(vectors, null, 1))
