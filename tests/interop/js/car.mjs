// Reads a ketten chain's CAR with the IPLD reference libraries, checks every
// block, and writes the chain again as a new CAR from the decoded values.
//
//   node car.mjs IN.car OUT.car
//
// For each block: the CID is recomputed from the bytes (sha2-256, dag-cbor),
// the block is decoded with @ipld/dag-cbor and encoded again (the bytes must
// not change). The chain is walked from the root through the `prev` links to
// the genesis. OUT.car gets the same root and the blocks head first (the
// reverse of ketten's order), each encoded anew from its decoded value.
// Prints one JSON object: {root, blocks: [{cid, seq, prev, prevHash, keys}]},
// blocks in walk order (head first). Exits 1 with a message on any mismatch.
import fs from 'node:fs'
import { Readable } from 'node:stream'
import { CarReader, CarWriter } from '@ipld/car'
import * as dagCbor from '@ipld/dag-cbor'
import { CID } from 'multiformats/cid'
import { sha256 } from 'multiformats/hashes/sha2'
import { equals, toHex } from 'multiformats/bytes'

function fail (message) {
  console.error(`interop: ${message}`)
  process.exit(1)
}

const [input, output] = process.argv.slice(2)
const reader = await CarReader.fromBytes(fs.readFileSync(input))
const roots = await reader.getRoots()
if (roots.length !== 1) fail(`expected one root, got ${roots.length}`)

const values = new Map()
for await (const { cid, bytes } of reader.blocks()) {
  const recomputed = CID.create(1, dagCbor.code, await sha256.digest(bytes))
  if (!recomputed.equals(cid)) fail(`block ${cid}: bytes hash to ${recomputed}`)
  const value = dagCbor.decode(bytes)
  if (!equals(dagCbor.encode(value), bytes)) fail(`block ${cid}: not canonical dag-cbor`)
  values.set(cid.toString(), value)
}

const walk = []
let cid = roots[0]
while (cid) {
  const value = values.get(cid.toString())
  if (!value) fail(`block ${cid} is missing`)
  walk.push({ cid, value })
  cid = value.prev
}

const { writer, out } = CarWriter.create([roots[0]])
const sink = fs.createWriteStream(output)
const done = new Promise((resolve, reject) => {
  Readable.from(out).pipe(sink).on('finish', resolve).on('error', reject)
})
for (const { value } of walk) {
  const bytes = dagCbor.encode(value)
  await writer.put({ cid: CID.create(1, dagCbor.code, await sha256.digest(bytes)), bytes })
}
await writer.close()
await done

console.log(JSON.stringify({
  root: roots[0].toString(),
  blocks: walk.map(({ cid, value }) => ({
    cid: cid.toString(),
    seq: value.seq,
    prev: value.prev ? value.prev.toString() : null,
    prevHash: value.prevHash ? toHex(value.prevHash) : null,
    keys: Object.keys(value).sort()
  }))
}))
