-- A map's indexes as the fold keeps them (the fourth part of the materializer library),
-- laid out as materializer.contract.index_entries says: per server, the map's indexed
-- fields in a hash (<map>\0I:[{tag}], field -> how it is declared) and per field one
-- sorted set of entries (<map>\0i:[{tag}]<field>), all at score 0, each the field's value
-- encoded so that byte order is value order, then the entity's key. The tag is the
-- marker's: a server's entries index the entities it holds.

-- The map's name and this server's tag, from its marker (<map>\0m:[{tag}]); nil for a
-- marker named otherwise (a test's own), whose map has no indexes.
local function marker_parts(marker)
  local at = string.find(marker, '\0m:', 1, true)
  if not at then return nil end
  return string.sub(marker, 1, at - 1), string.sub(marker, at + 3)
end

-- The map's indexes on this server (nil: none): their fields, whether each is built, each
-- field's sorted set, and the hash of what each expiring entity is indexed under (an
-- entity Redis expired can no longer be read: its entries are found there).
local function indexes_of(marker)
  local map, tag = marker_parts(marker)
  if not map then return nil end
  local declared = map .. '\0I:' .. tag
  local listed = redis.call('HGETALL', declared)
  if #listed == 0 then return nil end
  local fields, ready, sets = {}, {}, {}
  for i = 1, #listed, 2 do
    local n = #fields + 1
    fields[n] = listed[i]
    ready[n] = cjson.decode(listed[i + 1]).ready == true
    sets[n] = map .. '\0i:' .. tag .. listed[i]
  end
  return {declared = declared, fields = fields, ready = ready, sets = sets,
    reverse = map .. '\0j:' .. tag}
end

-- A number as 8 bytes whose byte order is its order: the IEEE double, big-endian, with
-- the sign bit flipped for a positive one and every bit flipped for a negative one.
local function ordered_number(x)
  if x == 0 then x = 0 end -- -0 and 0 are one value
  local packed = struct.pack('>d', x)
  local b1 = string.byte(packed, 1)
  if b1 < 128 then return string.char(b1 + 128) .. string.sub(packed, 2) end
  local a, b, c, d, e, f, g, h = string.byte(packed, 1, 8)
  return string.char(255 - a, 255 - b, 255 - c, 255 - d, 255 - e, 255 - f, 255 - g, 255 - h)
end

-- The entry of one field's value for an entity's key, nil for a value no index holds
-- (missing, null, an object or a list). Booleans 'b' and one byte, numbers 'n' and eight,
-- then the key; strings 's', their bytes with each zero byte as 0x00 0xFF, a zero byte,
-- then the key (no key's UTF-8 starts with 0xFF, so the end is never in doubt).
local function index_entry(value, key)
  local t = type(value)
  if t == 'string' then
    if string.find(value, '\0', 1, true) then value = string.gsub(value, '%z', '\0\255') end
    return 's' .. value .. '\0' .. key
  elseif t == 'number' then
    return 'n' .. ordered_number(value) .. key
  elseif t == 'boolean' then
    if value then return 'b\1' .. key end
    return 'b\0' .. key
  end
  return nil
end

-- An entity's entries by field (JSON text; nil or '' for no entity).
local function entries_of(ix, text, key)
  local out = {}
  if not text or text == '' then return out end
  local ok, decoded = pcall(cjson.decode, text)
  if not ok or type(decoded) ~= 'table' then return out end
  for _, field in ipairs(ix.fields) do out[field] = index_entry(decoded[field], key) end
  return out
end

-- Moves a key's entries from what it was indexed under to what it is now; an entry that
-- stays is left alone in a built index, and added again (a no-op when it is there) in
-- one being built, which may lack it yet.
local function reindex(ix, before, after)
  for i, field in ipairs(ix.fields) do
    local old, new = before[field], after[field]
    if old and old ~= new then redis.call('ZREM', ix.sets[i], old) end
    if new and (new ~= old or not ix.ready[i]) then redis.call('ZADD', ix.sets[i], 0, new) end
  end
end

-- What an entity is indexed under: for an expiring map the record kept beside it (it may
-- have expired, unswept), else its entries read from the value it holds.
local function indexed_under(ix, entity, key, expiring)
  if expiring then
    local packed = redis.call('HGET', ix.reverse, key)
    if packed then return cmsgpack.unpack(packed) end
  end
  return entries_of(ix, redis.call('GET', entity), key)
end

-- Records an expiring entity's entries (none: forgets it).
local function remember(ix, key, entries)
  if next(entries) == nil then
    redis.call('HDEL', ix.reverse, key)
  else
    redis.call('HSET', ix.reverse, key, cmsgpack.pack(entries))
  end
end

-- Before an entity is written: its entries move to the new value ('' deletes it).
-- ``expiring``: the map has ttl.redis, so the entries are recorded beside the entity.
local function index_write(ix, entity, key, value, expiring)
  if not ix then return end
  local after = entries_of(ix, value, key)
  reindex(ix, indexed_under(ix, entity, key, expiring), after)
  if expiring then remember(ix, key, after) end
end

-- An entity Redis expired: its recorded entries leave the indexes.
local function index_expired(ix, key)
  if not ix then return end
  local packed = redis.call('HGET', ix.reverse, key)
  if not packed then return end
  reindex(ix, cmsgpack.unpack(packed), {})
  redis.call('HDEL', ix.reverse, key)
end

-- The key an index entry ends with.
local function entry_key(entry)
  local kind = string.sub(entry, 1, 1)
  if kind == 'b' then return string.sub(entry, 3) end
  if kind == 'n' then return string.sub(entry, 10) end
  local at = 2
  while true do
    local z = string.find(entry, '\0', at, true)
    if string.byte(entry, z + 1) ~= 255 then return string.sub(entry, z + 1) end
    at = z + 2
  end
end

-- KEYS[1]: one index's sorted set on this server. ARGV: the entity keys' prefix, how many
-- entries at most, the map's indexed fields on this server, the field and its state as
-- the reader found it built, then spans of entries in order, each as ZRANGE BYLEX takes
-- its bounds (min, max). Returns per entry found the entry and its entity's value, read
-- in the same atomic call (false: an entity Redis expired, whose entry the next sweep
-- takes out); an error if the field is no longer in that state (dropped, or being built
-- again): its entries may be partial.
local function index_read(keys, args)
  if redis.call('HGET', args[3], args[4]) ~= args[5] then
    return redis.error_reply('MATERIALIZER_INDEX_CHANGED the index on ' .. args[4] ..
      ' is no longer the one the reader found built')
  end
  local out, left = {}, tonumber(args[2])
  for i = 6, #args - 1, 2 do
    if left <= 0 then break end
    local found = redis.call('ZRANGE', keys[1], args[i], args[i + 1], 'BYLEX', 'LIMIT', 0, left)
    for _, entry in ipairs(found) do
      out[#out + 1] = entry
      out[#out + 1] = redis.call('GET', args[1] .. entry_key(entry))
    end
    left = left - #found
  end
  return out
end
