"""The Lua scripts behind `daemon.redis_state`: each runs atomically in Redis, so replicas of
the daemon and the updater can share one Redis without races (see that module's key table).
"""

from dagsched.daemon.history_store import RECORD_FN

# All reservations of one batch round, in order, atomically (one EVALSHA per round).
# ARGV: ttl, key prefix, the entries as one string (below), workflow ttl. An entry is a line,
# its fields separated by
# tabs: task key "{wf}/{task}", attempt, node id, cores, mem, est core-s, mode (fit | queue |
# force), what the task declared (family, escaped: no tab or newline; type; cpu; mem;
# duration; cold start; all empty when unknown), its advertised run time on the node (empty
# when unknown), and last the decision JSON (JSON has no raw newline).
# The declared fields go into the ledger entry: the updater learns from them when the attempt
# ends, and the cold start and advertised run time say when it is expected to end once it
# starts (the `run` hash). A stored decision refreshes its workflow's keys' TTL (`wf`,
# `wfactive`): a workflow's keys live the workflow ttl past its last decision (or event),
# however long it runs.
# One argument and one reply string instead of a dozen arguments and two replies per entry:
# redis-py packs and parses each in pure Python, which cost more than the script itself.
# Returns {statuses, winner...}: one letter per entry (r reserved, q queued, d dup, x dead,
# n nofit), then the stored decision of each dup, in order.
# An entry sees the earlier entries' reservations, as the planner's view did.
DECIDE_LUA = """
local ttl, p, blob, wf_ttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local statuses, out, touched = {}, {''}, {}
local pos, n = 1, #blob
local pat = '^' .. string.rep('([^\\t]*)\\t', 14) .. '(.*)$'
while pos <= n do
  local e = string.find(blob, '\\n', pos, true) or (n + 1)
  local tk, att, nid, cs, ms, qs, mode, fam, ty, dc, dm, dd, cold, adv, decision =
    string.match(string.sub(blob, pos, e - 1), pat)
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
        if fam ~= '' then
          redis.call('HSET', led, 'fam', fam, 'ty', ty, 'dc', dc, 'dm', dm, 'dd', dd,
                     'cold', cold)
        end
        if adv ~= '' then redis.call('HSET', led, 'adv', adv) end
        redis.call('SADD', p .. 'nodeled:' .. nid, led)
        redis.call('SADD', wfactive, idx)
      end
    end
  end
  if (status == 'r' or status == 'q') and not touched[wf] then
    touched[wf] = true
    redis.call('EXPIRE', p .. 'wf:' .. wf, wf_ttl)
    redis.call('EXPIRE', wfactive, wf_ttl)
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
# The cluster view in one round trip and a few reply strings (not ~40 bulk strings per node,
# which the client parses one by one). KEYS: nodes set, clock, running attempts (`run`).
# ARGV: node key prefix, history key prefix, then fields. Returns {rows "id\tv1\tv2...\n..."
# sorted by id (missing fields empty), clock, the running attempts (a `run` value per line:
# node, compute began, advertised run time, family escaped), and per family they name its
# history hash (a line: the escaped family, then fields and values, all tab-separated)}.
VIEW_LUA = r"""
local ids = redis.call('SMEMBERS', KEYS[1])
table.sort(ids)
local fields = {unpack(ARGV, 3)}
local rows = {}
for i, id in ipairs(ids) do
  local v = redis.call('HMGET', ARGV[1] .. id, unpack(fields))
  for j = 1, #fields do v[j] = v[j] or '' end
  rows[i] = id .. '\t' .. table.concat(v, '\t')
end
local running = redis.call('HVALS', KEYS[3])
local seen, hists = {}, {}
for _, line in ipairs(running) do
  local fam = string.match(line, '^[^\t]*\t[^\t]*\t[^\t]*\t(.*)$')
  if fam and not seen[fam] then
    seen[fam] = true
    local raw = (string.gsub(fam, '\\(.)', {['\\'] = '\\', t = '\t', n = '\n'}))
    hists[#hists + 1] = fam .. '\t' .. table.concat(redis.call('HGETALL', ARGV[2] .. raw), '\t')
  end
end
return {table.concat(rows, '\n'), redis.call('GET', KEYS[2]) or '0',
        table.concat(running, '\n'), table.concat(hists, '\n')}
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


# What the updater learns from, for a batch's end events (read before the batch is applied).
# ARGV: key prefix, then "{wf}/{task}:{attempt}" per end event as one newline-separated
# string. Returns a line per event: the ledger entry's declared fields (family, type, cpu,
# mem, duration) and its node's kind, separated by tabs; an empty line when the attempt holds
# no ledger entry (ended before, or never reserved) or one without declared fields.
LEDGER_INFO_LUA = r"""
local p, out = ARGV[1], {}
for k in string.gmatch(ARGV[2], '[^\n]+') do
  local h = redis.call('HMGET', p .. 'led:' .. k, 'fam', 'ty', 'dc', 'dm', 'dd', 'node')
  if h[1] and h[6] then
    local kind = redis.call('HGET', p .. 'node:' .. h[6], 'kind') or 'cpu'
    out[#out + 1] = h[1] .. '\t' .. h[2] .. '\t' .. h[3] .. '\t' .. h[4] .. '\t' .. h[5] ..
      '\t' .. kind
  else
    out[#out + 1] = ''
  end
end
return table.concat(out, '\n')
"""

# A batch of `dagsched.events`, in order, atomically (`daemon.event_apply`).
# ARGV: key prefix, ttl of the workflows' keys (refreshed), half-life, rescale threshold, the
# batch's latest event time ('' for none), the events as one string, then the families that
# the end lines name by position (raw: any bytes). A line per event, fields separated by tabs:
#   h node at kind zone cores mem_gb gpu_mem_gb net_gbps used_cores used_mem_gb queue_len
#     net_in_bytes failure_rate slowdown      a heartbeat
#   d node at | u node at                     the node went down | came back, empty
#   s wf task attempt node at                 an attempt started
#   e wf task attempt node done [family# kind at cpu_b mem_b rt_b rt_ratio oom_limit]
#                                             an attempt ended (done 1: finished), and what
#                                             history learns from it
# Each is idempotent: an end releases its ledger entry and learns only if the entry is there
# (then deletes it); a start moves a queued entry to reserved and, for an entry with an
# advertised run time, keeps when its compute began in `run`, which an end or a node reset
# clears; a node reset or a heartbeat older than the node's last reset (or a heartbeat older
# than the last one) changes nothing.
APPLY_EVENTS_LUA = (
    RECORD_FN
    + r"""
local p, ttl, half, rescale, clock, blob = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4],
  ARGV[5], ARGV[6]
local touched, wfs = {}, {}
local function split(line)
  local t, pos = {}, 1
  while true do
    local e = string.find(line, '\t', pos, true)
    if not e then
      t[#t + 1] = string.sub(line, pos)
      return t
    end
    t[#t + 1] = string.sub(line, pos, e - 1)
    pos = e + 1
  end
end
local function touch(wf)
  if not touched[wf] then
    touched[wf] = true
    wfs[#wfs + 1] = wf
  end
end
local pos, n = 1, #blob
while pos <= n do
  local e = string.find(blob, '\n', pos, true) or (n + 1)
  local f = split(string.sub(blob, pos, e - 1))
  pos = e + 1
  local op = f[1]
  if op == 'h' then
    local key, at = p .. 'node:' .. f[2], tonumber(f[3])
    local cur = redis.call('HMGET', key, 'seen_at', 'reset_at', 'free_cores')
    if (tonumber(cur[1]) or at) <= at and (tonumber(cur[2]) or at) <= at then
      redis.call('HSET', key, 'kind', f[4], 'zone', f[5], 'cores', f[6], 'mem_gb', f[7],
        'gpu_mem_gb', f[8], 'net_gbps', f[9], 'alive', '1', 'seen_at', f[3],
        'used_cores', f[10], 'used_mem_gb', f[11], 'reported_queue_len', f[12],
        'net_in_bytes', f[13], 'failure_rate', f[14], 'slowdown', f[15])
      if not cur[3] then
        -- a node first heard of: the ledger starts full; later heartbeats never overwrite it
        redis.call('SADD', p .. 'nodes', f[2])
        redis.call('HSET', key, 'free_cores', f[6], 'free_mem', f[7], 'queue_len', '0',
          'queued_core_s', '0')
      end
    end
  elseif op == 'd' or op == 'u' then
    local key, nodeled = p .. 'node:' .. f[2], p .. 'nodeled:' .. f[2]
    local alive, at = (op == 'u') and '1' or '0', tonumber(f[3])
    local cur = redis.call('HMGET', key, 'reset_at', 'alive', 'cores', 'mem_gb')
    local last = tonumber(cur[1])
    if not (last and (at < last or (at == last and cur[2] == alive))) then
      for _, k in ipairs(redis.call('SMEMBERS', nodeled)) do
        redis.call('DEL', k)
        redis.call('HDEL', p .. 'run', k)
      end
      redis.call('DEL', nodeled)
      if cur[3] then
        redis.call('HSET', key, 'alive', alive, 'free_cores', cur[3], 'free_mem', cur[4],
          'queue_len', '0', 'queued_core_s', '0', 'reset_at', f[3])
      end
    end
  elseif op == 's' then
    local wf = f[2]
    local led = p .. 'led:' .. wf .. '/' .. f[3] .. ':' .. f[4]
    local h = redis.call('HMGET', led, 'state', 'node', 'cores', 'mem', 'core_s', 'adv', 'cold',
                         'fam')
    if h[1] == 'q' then
      local node = p .. 'node:' .. h[2]
      redis.call('HINCRBY', node, 'queue_len', -1)
      redis.call('HINCRBYFLOAT', node, 'queued_core_s', -tonumber(h[5]))
      redis.call('HINCRBYFLOAT', node, 'free_cores', -tonumber(h[3]))
      redis.call('HINCRBYFLOAT', node, 'free_mem', -tonumber(h[4]))
      redis.call('HSET', led, 'state', 'r')
    end
    if h[1] and h[6] then
      local began = string.format('%.17g', tonumber(f[6]) + (tonumber(h[7]) or 0))
      redis.call('HSET', p .. 'run', led, h[2] .. '\t' .. began .. '\t' .. h[6] .. '\t' ..
                 (h[8] or ''))
    end
    redis.call('HSET', p .. 'wfnode:' .. wf, f[3], f[5])
    touch(wf)
  elseif op == 'e' then
    local wf = f[2]
    local led = p .. 'led:' .. wf .. '/' .. f[3] .. ':' .. f[4]
    local h = redis.call('HMGET', led, 'state', 'node', 'cores', 'mem', 'core_s')
    if h[1] then
      local node = p .. 'node:' .. h[2]
      if h[1] == 'r' then
        redis.call('HINCRBYFLOAT', node, 'free_cores', tonumber(h[3]))
        redis.call('HINCRBYFLOAT', node, 'free_mem', tonumber(h[4]))
      else
        redis.call('HINCRBY', node, 'queue_len', -1)
        redis.call('HINCRBYFLOAT', node, 'queued_core_s', -tonumber(h[5]))
      end
      redis.call('DEL', led)
      redis.call('HDEL', p .. 'run', led)
      redis.call('SREM', p .. 'nodeled:' .. h[2], led)
      if f[7] then
        record_sample(hist_of(p .. 'hist:' .. ARGV[6 + tonumber(f[7])]), f[8], f[9], f[10],
          f[11], f[12], f[13], f[14], half, rescale)
      end
    end
    if f[6] == '1' then redis.call('SADD', p .. 'wfdone:' .. wf, f[3]) end
    redis.call('SREM', p .. 'wfactive:' .. wf, f[3])
    touch(wf)
  else
    return redis.error_reply('unknown event line ' .. op)
  end
end
hist_flush()
for _, wf in ipairs(wfs) do
  for _, s in ipairs({'wf:', 'wfnode:', 'wfdone:', 'wfactive:'}) do
    redis.call('EXPIRE', p .. s .. wf, ttl)
  end
end
if clock ~= '' then
  local cur = tonumber(redis.call('GET', p .. 'clock') or '0')
  if tonumber(clock) > cur then redis.call('SET', p .. 'clock', clock) end
end
return #wfs
"""
)
