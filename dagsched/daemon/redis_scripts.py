"""The Lua scripts behind `daemon.redis_state`: each runs atomically in Redis, so replicas of
the daemon and the updater can share one Redis without races (see that module's key table).
"""

# All reservations of one batch round, in order, atomically (one EVALSHA per round).
# ARGV: ttl, key prefix, then the entries as one string: a line each, its fields separated by
# tabs: task key "{wf}/{task}", attempt, node id, cores, mem, est core-s, mode (fit | queue |
# force), and last the decision JSON (JSON has no raw newline). One argument and one reply
# string instead of twelve arguments and two replies per entry: redis-py packs and parses
# each in pure Python, which cost more than the script itself.
# Returns {statuses, winner...}: one letter per entry (r reserved, q queued, d dup, x dead,
# n nofit), then the stored decision of each dup, in order.
# An entry sees the earlier entries' reservations, as the planner's view did.
DECIDE_LUA = """
local ttl, p, blob = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local statuses, out = {}, {''}
local pos, n = 1, #blob
while pos <= n do
  local e = string.find(blob, '\\n', pos, true) or (n + 1)
  local tk, att, nid, cs, ms, qs, mode, decision = string.match(string.sub(blob, pos, e - 1),
    '^([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)\\t(.*)$')
  pos = e + 1
  local wf, idx = string.match(tk, '^(.*)/([^/]*)$')
  local dec, node = p .. 'dec:' .. tk .. ':' .. att, p .. 'node:' .. nid
  local led, wfactive = p .. 'led:' .. tk .. ':' .. att, p .. 'wfactive:' .. wf
  local status = 'r'
  local prev = redis.call('GET', dec)
  if prev then
    status = 'd'
    out[#out + 1] = prev
  else
    local h = redis.call('HMGET', node, 'alive', 'free_cores', 'free_mem')
    if h[1] ~= '1' then
      if mode == 'force' then
        -- resync after an outage: keep the decision; the node is gone or not heard of yet
        redis.call('SET', dec, decision, 'EX', ttl)
        redis.call('SADD', wfactive, idx)
        status = 'q'
      else
        status = 'x'
      end
    else
      local fc, fm = tonumber(h[2]) or 0, tonumber(h[3]) or 0
      local c, m = tonumber(cs), tonumber(ms)
      -- nodes backfill: what fits starts now, whatever waits in the node's queue
      if fc + 1e-9 >= c and fm + 1e-9 >= m then
        redis.call('HINCRBYFLOAT', node, 'free_cores', -c)
        redis.call('HINCRBYFLOAT', node, 'free_mem', -m)
      elseif mode == 'fit' then
        status = 'n'
      else
        redis.call('HINCRBY', node, 'queue_len', 1)
        redis.call('HINCRBYFLOAT', node, 'queued_core_s', qs)
        status = 'q'
      end
      if status ~= 'n' then
        redis.call('SET', dec, decision, 'EX', ttl)
        redis.call('HSET', led, 'node', nid, 'cores', cs, 'mem', ms, 'core_s', qs,
                   'state', status)
        redis.call('SADD', p .. 'nodeled:' .. nid, led)
        redis.call('SADD', wfactive, idx)
      end
    end
  end
  statuses[#statuses + 1] = status
end
out[1] = table.concat(statuses)
return out
"""

# The stored decisions of a batch's tasks in one reply. ARGV: key prefix, then the decision
# keys' suffixes "{wf}/{task}:{attempt}" as one newline-separated string. Returns {found,
# decision...}: one letter per key (1 stored, 0 not), then the stored ones in order.
STORED_LUA = """
local p, blob = ARGV[1], ARGV[2]
local found, out = {}, {''}
for k in string.gmatch(blob, '[^\\n]+') do
  local v = redis.call('GET', p .. 'dec:' .. k)
  if v then
    found[#found + 1] = '1'
    out[#out + 1] = v
  else
    found[#found + 1] = '0'
  end
end
out[1] = table.concat(found)
return out
"""

# KEYS: ledger, node hash, nodeled. ARGV: 'start' | 'end'
LEDGER_LUA = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 0 end
local c = tonumber(redis.call('HGET', KEYS[1], 'cores'))
local m = tonumber(redis.call('HGET', KEYS[1], 'mem'))
local cs = tonumber(redis.call('HGET', KEYS[1], 'core_s'))
if ARGV[1] == 'start' then
  if st == 'q' then
    redis.call('HINCRBY', KEYS[2], 'queue_len', -1)
    redis.call('HINCRBYFLOAT', KEYS[2], 'queued_core_s', -cs)
    redis.call('HINCRBYFLOAT', KEYS[2], 'free_cores', -c)
    redis.call('HINCRBYFLOAT', KEYS[2], 'free_mem', -m)
    redis.call('HSET', KEYS[1], 'state', 'r')
  end
  return 1
end
if st == 'r' then
  redis.call('HINCRBYFLOAT', KEYS[2], 'free_cores', c)
  redis.call('HINCRBYFLOAT', KEYS[2], 'free_mem', m)
else
  redis.call('HINCRBY', KEYS[2], 'queue_len', -1)
  redis.call('HINCRBYFLOAT', KEYS[2], 'queued_core_s', -cs)
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], KEYS[1])
return 1
"""

# KEYS: node hash, nodeled. ARGV: alive (0|1). A node that goes down or comes back is empty.
RESET_NODE_LUA = """
local led = redis.call('SMEMBERS', KEYS[2])
for _, k in ipairs(led) do redis.call('DEL', k) end
redis.call('DEL', KEYS[2])
local cores = redis.call('HGET', KEYS[1], 'cores')
if not cores then return 0 end
redis.call('HSET', KEYS[1], 'alive', ARGV[1], 'free_cores', cores,
           'free_mem', redis.call('HGET', KEYS[1], 'mem_gb'), 'queue_len', 0, 'queued_core_s', 0)
return 1
"""

MAX_CLOCK_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


# The decision log: per record, the same id in both streams (the small one is what
# `dagsched explain` searches). KEYS: keys stream, records stream.
# ARGV: maxlen (entries), ttl (s), then per record: its keys (space-separated), the record.
LOG_LUA = """
local maxlen, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local id = redis.call('XADD', KEYS[1], '*', 'k', ARGV[i])
  redis.pcall('XADD', KEYS[2], id, 'r', ARGV[i + 1])
end
local t = redis.call('TIME')
local oldest = (tonumber(t[1]) - ttl) * 1000
for _, key in ipairs(KEYS) do
  redis.call('XTRIM', key, 'MAXLEN', maxlen)
  if oldest > 0 then redis.call('XTRIM', key, 'MINID', oldest) end
  redis.call('EXPIRE', key, ttl)
end
return 1
"""
# The cluster view in one round trip and one reply string (not ~40 bulk strings per node, which
# the client parses one by one). KEYS: nodes set, clock. ARGV: node key prefix, then fields.
# Returns {rows "id\tv1\tv2...\n..." sorted by id (missing fields empty), clock}.
VIEW_LUA = r"""
local ids = redis.call('SMEMBERS', KEYS[1])
table.sort(ids)
local fields = {unpack(ARGV, 2)}
local rows = {}
for i, id in ipairs(ids) do
  local v = redis.call('HMGET', ARGV[1] .. id, unpack(fields))
  for j = 1, #fields do v[j] = v[j] or '' end
  rows[i] = id .. '\t' .. table.concat(v, '\t')
end
return {table.concat(rows, '\n'), redis.call('GET', KEYS[2]) or '0'}
"""
VIEW_FIELDS = (
    "kind", "zone", "cores", "mem_gb", "gpu_mem_gb", "net_gbps", "alive", "free_cores",
    "free_mem", "queue_len", "queued_core_s", "net_in_bytes", "failure_rate", "slowdown",
)  # fmt: skip

# Where workflows stand, in one round trip and one reply string. ARGV: key prefix, then
# workflow ids. Returns a line per workflow: done indices "1,2", a tab, active ones, a tab, and
# task nodes "0=n1,3=n2" (node ids have no tab, comma, equals sign or newline).
PROGRESS_LUA = r"""
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local h = redis.call('HGETALL', ARGV[1] .. 'wfnode:' .. id)
  local pairs_ = {}
  for j = 1, #h, 2 do pairs_[#pairs_ + 1] = h[j] .. '=' .. h[j + 1] end
  out[#out + 1] = table.concat(redis.call('SMEMBERS', ARGV[1] .. 'wfdone:' .. id), ',') ..
    '\t' .. table.concat(redis.call('SMEMBERS', ARGV[1] .. 'wfactive:' .. id), ',') ..
    '\t' .. table.concat(pairs_, ',')
end
return table.concat(out, '\n')
"""
