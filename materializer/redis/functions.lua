-- Materializer's fold functions (the last part of the materializer library, after
-- text.lua, merge.lua, aggregate.lua and index.lua). Loaded with FUNCTION LOAD REPLACE at every start.
--
-- KEYS[1] is one entity key of the call, which routes it to its master on a cluster;
-- every key a call touches comes in ARGV, and lives on that master (the flag below).
-- The writing functions' ARGV start with the change stream ('' for none), PX
-- milliseconds or '', batch id, stream MAXLEN, the entity keys' prefix length, the
-- map's marker on this server, how long a deleted entity's state stays (PX ms), the
-- map's expiry index on this server ('' without a TTL), the map's owner key on this
-- server and the writer's epoch ('' outside a worker group).

-- Whether this server holds the map's copy whole: a server restarted empty (or replaced)
-- has no marker, and nothing may be folded onto it before the copy is restored.
local function whole(args)
  return redis.call('EXISTS', args[6]) == 1
end

-- The server's clock in epoch milliseconds: the clock its key expiries follow.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function lost()
  return redis.error_reply('MATERIALIZER_LOST this server has no marker of the map: its copy is lost')
end

-- Whether a newer owner took the map over: its epoch on this server exceeds the writer's.
-- A writer's epoch above the key's (or no key: a master new to the cluster, or one that
-- restarted empty) raises the key to it, so the owner's first write on a master fences
-- there any older writer its claim did not reach.
local function fenced(args)
  if args[10] == '' then return false end
  local owner = redis.call('GET', args[9])
  if owner == false or tonumber(owner) < tonumber(args[10]) then
    redis.call('SET', args[9], args[10])
    return false
  end
  return tonumber(owner) > tonumber(args[10])
end

local function refused(args)
  if not whole(args) then return lost() end
  if fenced(args) then
    return redis.error_reply('MATERIALIZER_FENCED epoch ' .. args[10] ..
      ' is no longer the map\'s owner: another worker took it over')
  end
  return nil
end

-- Sets the entity (value '' deletes it) and its state, and appends its change entry.
-- A deleted entity's state stays for the map's deleted_retention (or its TTL if shorter):
-- long enough that a replay cannot bring the entity back, short enough that churn does
-- not grow the map; the entity's next write takes the expiry off. An expiring entity is
-- (re)scored in the expiry index, a deleted one leaves it. ``ix``: the map's indexes on
-- this server (``indexes_of``), whose entries move with the entity.
local function write(args, ix, entity, state_key, state, value)
  local stream, ttl, batch, maxlen = args[1], args[2], args[3], args[4]
  local key = string.sub(entity, tonumber(args[5]) + 1)
  index_write(ix, entity, key, value, args[8] ~= '')
  local op = 'upsert'
  local px = ttl
  if value == '' then
    redis.call('DEL', entity)
    op = 'delete'
    if ttl == '' or tonumber(args[7]) < tonumber(ttl) then px = args[7] end
    if args[8] ~= '' then redis.call('ZREM', args[8], key) end
  elseif ttl == '' then
    redis.call('SET', entity, value)
  else
    redis.call('SET', entity, value, 'PX', ttl)
    if args[8] ~= '' then redis.call('ZADD', args[8], now_ms() + tonumber(ttl), key) end
  end
  if px == '' then
    redis.call('SET', state_key, state)
  else
    redis.call('SET', state_key, state, 'PX', px)
  end
  if stream ~= '' then
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'key', key, 'op', op, 'batch_id', batch)
  end
end

-- Applies a record whose order is greater than the stored one: 1 when applied, else the
-- entity's current value (false: none).
local function later(args, ix, entity, state_key, order, value)
  local current = redis.call('GET', state_key)
  if (not current) or after(order, current) then
    write(args, ix, entity, state_key, order, value)
    return 1
  end
  return redis.call('GET', entity)
end

-- ARGV after the ten: per record its entity key, state key, order and value ('' deletes).
-- Applies a record whose order is greater than the stored one. Returns per record 1
-- when applied, else the entity's current value (false: none).
local function latest(keys, args)
  local refusal = refused(args)
  if refusal then return refusal end
  local ix = indexes_of(args[6])
  local out = {}
  for i = 0, (#args - 10) / 4 - 1 do
    out[i + 1] = later(args, ix, args[11 + 4 * i], args[12 + 4 * i], args[13 + 4 * i],
      args[14 + 4 * i])
  end
  return out
end

-- The map's fold from its spec ('' for ``latest``, ``live.query.function_fold``): its
-- merge (merge.lua) or its aggregates (aggregate.lua).
local function fold_of(spec)
  if spec == '' then return nil end
  local decoded = cjson.decode(spec)
  if decoded.merge then return {merge = merge_fields(decoded)} end
  return {aggregate = aggregate_specs(decoded.aggregate)}
end

-- A record of a merge or aggregate map folded into its key's state: the entity after it
-- (false: none). A record that changes nothing (folded before) writes nothing.
local function folded(args, ix, fold, place, offset, entity, state_key, order, value, aux)
  local state = redis.call('GET', state_key) or nil
  local current = nil
  if state == nil then current = redis.call('GET', entity) or nil end
  local payload = nil
  if value ~= '' then payload = value end
  local after_state, built
  if fold.merge then
    after_state, built = merge_fold(fold.merge, state, current, order, payload, aux)
  else
    after_state, built = aggregate_fold(fold.aggregate, state, current, place, offset, payload)
  end
  if after_state == nil or after_state == state then return redis.call('GET', entity) end
  write(args, ix, entity, state_key, after_state, built or '')
  return built or false
end

-- The real-time path's positions in the map's watermark hash: per topic, per partition,
-- the next offset to apply.
local function positions(meta)
  local raw = redis.call('HGET', meta, 'offsets')
  if raw then return cjson.decode(raw) end
  return {}
end

-- The positions written back, with the batch and the writer that moved them.
local function move(args, meta, offsets)
  redis.call('HSET', meta, 'offsets', cjson.encode(offsets), 'batch_id', args[3],
    'app_id', args[12], 'updated_at_ms', now_ms())
end

-- The real-time path's call (``materializer.live``): ARGV after the ten are the map's
-- watermark hash, the writer's app id and the map's fold ('' for ``latest``, else the
-- mode's spec as JSON: {"merge": fields} or {"aggregate": aggregates}), then per record
-- its topic, partition, offset, entity key, state key, order ('' for a record that
-- failed), value ('' deletes; aggregate: the inputs) and aux (merge: the fields it sets
-- to null). A record at or past its partition's next offset
-- in the watermark is new: it applies as in ``latest``, or folds (a failed one only
-- moves the position), and the watermark's next offset moves past it, in the same atomic
-- call. One before it was applied already (the replay of a batch after a restart) and
-- changes nothing. So the call is idempotent by source position, whatever batches the
-- records come in. Returns per record 1 when applied (``latest``), 0 for a new record
-- that failed, -1 for one already applied that failed, else the entity's current value
-- (false: none), which the changelog then carries: a query starts where Kafka took its
-- last transaction, so the records it reads that the watermark has passed are those
-- whose changelog and dead letters may be missing.
local function live(keys, args)
  local refusal = refused(args)
  if refusal then return refusal end
  local meta = args[11]
  local offsets = positions(meta)
  local fold = fold_of(args[13])
  local ix = indexes_of(args[6])
  local moved = false
  local out = {}
  for i = 0, (#args - 13) / 8 - 1 do
    local b = 14 + 8 * i
    local topic, partition, offset = args[b], args[b + 1], tonumber(args[b + 2])
    local entity, state_key, order, value = args[b + 3], args[b + 4], args[b + 5], args[b + 6]
    local parts = offsets[topic]
    if parts == nil then
      parts = {}
      offsets[topic] = parts
    end
    local next_offset = parts[partition]
    if next_offset ~= nil and offset < tonumber(next_offset) then
      if order == '' then out[i + 1] = -1 else out[i + 1] = redis.call('GET', entity) end
    else
      parts[partition] = offset + 1
      moved = true
      if order == '' then
        out[i + 1] = 0
      elseif fold then
        out[i + 1] = folded(args, ix, fold, topic .. ':' .. partition, args[b + 2], entity,
          state_key, order, value, args[b + 7])
      else
        out[i + 1] = later(args, ix, entity, state_key, order, value)
      end
    end
  end
  if moved then move(args, meta, offsets) end
  return out
end

-- A map's state key of an entity key (``redis_layout.state_key``): the map's name, its
-- state mark, and the entity key's hash tag (the key after it when it has one of its own).
local function state_of(map, entity, key)
  local open = string.find(entity, '{', 1, true)
  local close = open and string.find(entity, '}', open + 1, true)
  if open and close and close > open + 1 then return map .. '\0o:' .. key end
  return map .. '\0o:{' .. entity .. '}'
end

-- A truncate on the real-time path (``materializer.redis.truncate``): ARGV after the
-- thirteen of ``live`` are the truncate's topic, partition, offset and order, the map's
-- name, then the names under it that are not entities (``RESERVED_KEYS``). Every entity
-- of the map on this server is deleted at the truncate's order, as its record would
-- delete it, and the position moves past the truncate, in one atomic call: nothing else
-- runs until every entity is gone. A truncate applied before changes nothing. Returns
-- each entity key's name and its value after the call (false: none), for the changelog.
local function truncate(keys, args)
  local refusal = refused(args)
  if refusal then return refusal end
  local meta = args[11]
  local offsets = positions(meta)
  local topic, partition, offset, order, map = args[14], args[15], args[16], args[17], args[18]
  local parts = offsets[topic] or {}
  offsets[topic] = parts
  local out = {}
  local next_offset = parts[partition]
  if next_offset ~= nil and tonumber(offset) < tonumber(next_offset) then
    -- Applied before: each key whose state stays after its delete, with its value now,
    -- for the changelog records a crash may have kept from Kafka.
    local mark = map .. '\0o:'
    local cursor = '0'
    repeat
      local page = redis.call('SCAN', cursor, 'MATCH', mark .. '*', 'COUNT', 1000)
      cursor = page[1]
      for _, state_key in ipairs(page[2]) do
        local rest = string.sub(state_key, #mark + 1)
        local key = rest
        local whole = '{' .. map .. ':'
        if string.sub(rest, 1, #whole) == whole and string.sub(rest, -1) == '}' then
          key = string.sub(rest, #whole + 1, -2)
        end
        out[#out + 1] = key
        out[#out + 1] = redis.call('GET', map .. ':' .. key)
      end
    until cursor == '0'
    return out
  end
  local reserved = {}
  for i = 19, #args do reserved[map .. ':' .. args[i]] = true end
  local fold = fold_of(args[13])
  local ix = indexes_of(args[6])
  local place = topic .. ':' .. partition
  local cursor = '0'
  repeat
    local page = redis.call('SCAN', cursor, 'MATCH', map .. ':*', 'COUNT', 1000)
    cursor = page[1]
    for _, entity in ipairs(page[2]) do
      if not reserved[entity] then
        local key = string.sub(entity, #map + 2)
        local state_key = state_of(map, entity, key)
        if fold then
          folded(args, ix, fold, place, offset, entity, state_key, order, '', '')
        else
          later(args, ix, entity, state_key, order, '')
        end
        out[#out + 1] = key
        out[#out + 1] = redis.call('GET', entity)
      end
    end
  until cursor == '0'
  parts[partition] = tonumber(offset) + 1
  move(args, meta, offsets)
  return out
end

-- The previous release's real-time call: no fold spec, no aux (``latest`` only).
local function live_v5(keys, args)
  local out = {}
  for i = 1, 12 do out[i] = args[i] end
  out[13] = ''
  for i = 0, (#args - 12) / 7 - 1 do
    for j = 0, 6 do out[#out + 1] = args[13 + 7 * i + j] end
    out[#out + 1] = ''
  end
  return live(keys, out)
end

-- ARGV: state key, entity key, per key. Returns both values per key (false: none).
local function read(keys, args)
  local out = {}
  for i = 1, #args do out[i] = redis.call('GET', args[i]) end
  return out
end

-- ARGV after the ten: per key its entity key, state key, the state its fold read ('' for
-- none), the new state and value ('' removes the entity). Writes a key only if its state
-- is still the one its fold read. Returns per key 1 when written, 0 when its state had
-- changed.
local function put(keys, args)
  local refusal = refused(args)
  if refusal then return refusal end
  local ix = indexes_of(args[6])
  local out = {}
  for i = 0, (#args - 10) / 5 - 1 do
    local entity, state_key = args[11 + 5 * i], args[12 + 5 * i]
    if (redis.call('GET', state_key) or '') ~= args[13 + 5 * i] then
      out[i + 1] = 0
    else
      write(args, ix, entity, state_key, args[14 + 5 * i], args[15 + 5 * i])
      out[i + 1] = 1
    end
  end
  return out
end

-- ARGV from ``first``: per key its entity key, state key, value and PX milliseconds (''
-- for none). Restores an entity this server lost: written only where neither it nor its
-- state is (a key the fold wrote since, or deleted, keeps what the fold made of it), and
-- indexed (``ix``; ``prefix``: the entity keys' prefix length). Returns how many were
-- written.
local function restored(args, ix, prefix, first)
  local written = 0
  for i = 0, (#args - first + 1) / 4 - 1 do
    local b = first + 4 * i
    local entity, state_key, value, px = args[b], args[b + 1], args[b + 2], args[b + 3]
    if redis.call('EXISTS', entity, state_key) == 0 then
      index_write(ix, entity, string.sub(entity, prefix + 1), value, px ~= '')
      if px == '' then
        redis.call('SET', entity, value)
      else
        redis.call('SET', entity, value, 'PX', px)
      end
      written = written + 1
    end
  end
  return written
end

-- ARGV: the map's marker on this server, the entity keys' prefix length, then the
-- entities as ``restored`` takes them.
local function fill(keys, args)
  return restored(args, indexes_of(args[1]), tonumber(args[2]), 3)
end

-- ARGV: the map's marker on this server, the entity keys' prefix length, whether the map
-- expires entities ('1' or ''), one indexed field, its state as the build found it and
-- its state once built ('' for none), then entity keys. Adds each entity's entry to the
-- field's index: what builds an index declared while the map runs, a chunk of the
-- server's entities at a time, while the fold keeps the entries of what it writes. With
-- the states, marks the field built, if it is still as found (not dropped, nor declared
-- again, meanwhile). Returns how many entries were added.
local function index_build(keys, args)
  local ix = indexes_of(args[1])
  if not ix then return 0 end
  local at = nil
  for i, field in ipairs(ix.fields) do if field == args[4] then at = i end end
  if not at then return 0 end -- dropped meanwhile
  local one = {fields = {args[4]}, ready = {false}, sets = {ix.sets[at]}}
  local prefix = tonumber(args[2])
  local added = 0
  for i = 7, #args do
    local key = string.sub(args[i], prefix + 1)
    local entry = entries_of(one, redis.call('GET', args[i]), key)[args[4]]
    if entry then
      redis.call('ZADD', one.sets[1], 0, entry)
      added = added + 1
      if args[3] ~= '' then
        local packed = redis.call('HGET', ix.reverse, key)
        local recorded = {}
        if packed then recorded = cmsgpack.unpack(packed) end
        recorded[args[4]] = entry
        remember(ix, key, recorded)
      end
    end
  end
  if args[6] ~= '' then
    if redis.call('HGET', ix.declared, args[4]) == args[5] then
      redis.call('HSET', ix.declared, args[4], args[6])
    end
  end
  return added
end

-- ARGV: the change stream ('' for none), its MAXLEN, the entity keys' prefix, the map's
-- marker, expiry index and expired set on this server, and how many keys at most.
-- Moves keys whose expiry is due and whose entity Redis has expired from the index to
-- the expired set, with an 'expire' change entry each; a key written since (a later
-- PTTL) is scored again. Returns the keys it found expired.
local function expire(keys, args)
  if redis.call('EXISTS', args[4]) == 0 then return lost() end
  local ix = indexes_of(args[4])
  local now = now_ms()
  local out = {}
  local due = redis.call('ZRANGE', args[5], '-inf', now, 'BYSCORE', 'LIMIT', 0, args[7])
  for _, key in ipairs(due) do
    local left = redis.call('PTTL', args[3] .. key)
    if left > 0 then
      redis.call('ZADD', args[5], now + left, key)
    else
      redis.call('ZREM', args[5], key)
      if left == -2 then
        index_expired(ix, key)
        redis.call('SADD', args[6], key)
        if args[1] ~= '' then
          redis.call('XADD', args[1], 'MAXLEN', '~', args[2], '*',
            'key', key, 'op', 'expire', 'batch_id', '-1')
        end
        out[#out + 1] = key
      end
    end
  end
  return out
end

-- KEYS[1]: the map's epoch key. Hands out the
-- next owner's epoch: the server's clock in milliseconds, or one more than the last
-- one handed out if the clock is behind it, so an epoch keeps growing even where a
-- server restarted empty. Returns it; ``raise`` then sets it on every master.
local function next_epoch(keys, args)
  local last = tonumber(redis.call('GET', keys[1]) or '0')
  local epoch = math.max(now_ms(), last + 1)
  redis.call('SET', keys[1], epoch)
  return epoch
end

-- KEYS[1]: the map's owner key on this server; ARGV[1]: an owner's epoch. Sets it unless
-- a newer owner's is already there. Returns the epoch the key holds after the call.
local function raise(keys, args)
  local owner = redis.call('GET', keys[1])
  if owner ~= false and tonumber(owner) >= tonumber(args[1]) then return tonumber(owner) end
  redis.call('SET', keys[1], args[1])
  return tonumber(args[1])
end

-- The previous release's calls: its eight fixed arguments, no owner key and no epoch.
local function unowned(args)
  local out = {}
  for i = 1, 8 do out[i] = args[i] end
  out[9], out[10] = '', ''
  for i = 9, #args do out[i + 2] = args[i] end
  return out
end

redis.register_function{function_name='materializer_latest_v3',
  callback=function(keys, args) return latest(keys, unowned(args)) end,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_put_v3',
  callback=function(keys, args) return put(keys, unowned(args)) end,
  flags={'allow-cross-slot-keys'}}
-- The writing functions keep the map's indexes since their v5 (live: v7, expire: v4). The
-- names before are kept for the previous release's workers in a rolling upgrade, and
-- keep the indexes too; a library of that release, loaded over this one, answers this
-- release's names "not found", so a worker of this release loads its own again.
redis.register_function{function_name='materializer_latest_v4', callback=latest,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_latest_v5', callback=latest,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_live_v5', callback=live_v5,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_live_v6', callback=live,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_live_v7', callback=live,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_truncate_v1', callback=truncate,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_read_v3', callback=read,
  flags={'no-writes', 'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_index_read_v1', callback=index_read,
  flags={'no-writes', 'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_put_v4', callback=put,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_put_v5', callback=put,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_next_epoch_v4', callback=next_epoch}
redis.register_function{function_name='materializer_raise_epoch_v4', callback=raise}
redis.register_function{function_name='materializer_fill_v3',
  callback=function(keys, args) return restored(args, nil, 0, 1) end,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_fill_v4', callback=fill,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_index_build_v1', callback=index_build,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_expire_v3', callback=expire,
  flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='materializer_expire_v4', callback=expire,
  flags={'allow-cross-slot-keys'}}
