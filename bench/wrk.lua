-- The requests of `make bench`, for wrk (bench/wrk.ts runs it; see bench/README.md).
--
--   wrk -s bench/wrk.lua <origin> -- <mode> <path> <rows> <threads> <seed> <tag> ["Name: value" ...]
--
-- modes (<path> is the fixed part of the request target):
--   static  GET <path>, the same request every time (a first page)
--   id      GET <path><id>, id uniform in 1..rows (GET /users/{id})
--   after   GET <path><N>, N uniform in 0..rows-50 (a keyset page: ...&id[gt]=N)
--   post    POST <path> {"name", "email"}: an e-mail no other request uses
--   product POST <path> {"sku", "name", "price", "currency"}: a SKU no other request uses
--   batch:N POST <path> {"operations": [N × {"method": "POST", "path": "/products", "body": a product as
--           `product` sends it}]}: N creations in one request, each with a SKU no other operation uses
--   patch   PATCH <path><id> with If-Match: the row's current ETag, see below
-- The trailing arguments are request headers (the credential, content type).
--
-- Each wrk thread has its own Lua state: setup() numbers them, init() seeds
-- each thread's generator from <seed> and its number, so threads do not send
-- the same id sequence. done() prints one line, `BENCH_RESULT {json}`, with
-- the counts, errors and latency percentiles that bench/wrk.ts parses.
--
-- PATCH and If-Match: run.ts sets every product's version back to 1 before
-- each run, and each thread owns a contiguous block of ids that it walks in
-- order from a random start. A row's ETag is then "v" .. (1 + the visits this
-- thread made to it), known without reading it; a row is never in flight
-- twice as long as the block is larger than the connections; and every
-- PATCH changes `stock` (to a value no seeded row has), so every success
-- advances the version by exactly one. A 412 is therefore a real error.

local threads_started = 0

function setup(thread)
  thread:set("thread_number", threads_started)
  threads_started = threads_started + 1
end

local mode, path, rows, tag
local operations -- batch:N: the creations in each request
local headers = {}
local fixed -- the request, when it never changes
local counter = 0
local block_first, block_size, walk -- patch: this thread's ids, and where it is in them
local visits = {}

function init(args)
  mode, path, rows = args[1], args[2], tonumber(args[3])
  local threads, seed = tonumber(args[4]), tonumber(args[5])
  tag = args[6]
  for i = 7, #args do
    local name, value = string.match(args[i], "^([^:]+):%s*(.*)$")
    headers[name] = value
  end
  math.randomseed(seed * 1009 + thread_number)
  operations = tonumber(string.match(mode, "^batch:(%d+)$"))
  if operations then mode = "batch" end
  if mode == "static" then
    fixed = wrk.format("GET", path, headers)
  elseif mode == "patch" then
    block_size = math.floor(rows / threads)
    block_first = 1 + thread_number * block_size
    walk = math.random(0, block_size - 1)
  end
end

local function post()
  counter = counter + 1
  local body = string.format('{"name":"Bench New User","email":"new-%s-%d-%d@bench.example.com"}', tag, thread_number, counter)
  return wrk.format("POST", path, headers, body)
end

-- A product with a SKU unique to this run, thread, request and place in the request (SKUs allow [A-Za-z0-9._-]).
-- Seeded SKUs are SKU-<8 digits>, seeded prices below 1,000,000.
local function product(i)
  return string.format('{"sku":"N-%s-%d-%d-%d","name":"Bench New Product","price":%d,"currency":"EUR"}',
    tag, thread_number, counter, i, (counter * 7919 + i) % 1000000)
end

local function post_product()
  counter = counter + 1
  return wrk.format("POST", path, headers, product(0))
end

local function batch()
  counter = counter + 1
  local ops = {}
  for i = 1, operations do
    ops[i] = '{"method":"POST","path":"/products","body":' .. product(i) .. '}'
  end
  return wrk.format("POST", path, headers, '{"operations":[' .. table.concat(ops, ",") .. ']}')
end

local function patch()
  local id = block_first + walk
  walk = (walk + 1) % block_size
  local version = 1 + (visits[id] or 0)
  visits[id] = version
  headers["If-Match"] = '"v' .. version .. '"'
  -- Seeded stock is below 1,000: this value always differs from the row's.
  local body = string.format('{"stock":%d}', 1000 + version)
  return wrk.format("PATCH", path .. id, headers, body)
end

function request()
  if fixed then return fixed end
  if mode == "id" then return wrk.format("GET", path .. math.random(1, rows), headers) end
  if mode == "after" then return wrk.format("GET", path .. math.random(0, rows - 50), headers) end
  if mode == "post" then return post() end
  if mode == "product" then return post_product() end
  if mode == "batch" then return batch() end
  if mode == "patch" then return patch() end
  error("bench/wrk.lua: unknown mode " .. tostring(mode))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%.0f,"p99":%.0f,"max":%.0f,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max, latency.mean))
end
