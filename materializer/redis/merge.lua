-- The merge fold (part of the materializer library, after text.lua): one event into a
-- key's state, and the entity rebuilt from it. What it means, and why the state is what
-- it is, is materializer.fold.merge's docstring; this is the fold the real-time path
-- applies. Its state is MergeFolder's: {"d": last delete, "e": last event, "l": {leaf:
-- [order, value]}, "o": {object: [set, nulled]}}, "l" and "o" left out when empty, read
-- keeping each value's text (cjson would read a number as a double). A leaf or object is
-- named by its key's JSON text as the state holds it, so that no name is unescaped.

local MERGE_SEED = ''

-- The later of two orders (nil: none); st.after compares the map's orders.
local function later_of(st, a, b)
  if b == nil then return a end
  if a ~= nil and st.after(a, b) then return a end
  return b
end

-- Whether order counts after cutoff (no cutoff: nothing removed yet, any order counts).
local function counts(st, order, cutoff)
  return order ~= nil and (cutoff == nil or st.after(order, cutoff))
end

-- The map's merge from its spec: {"merge": fields (MergeFolder.lua_spec), "digits": whether
-- its orders are digits and zero bytes only}. Per field, depth first, its name, its key
-- as the state's JSON writes it, its parent's place (0: the entity) and whether it is an
-- object; with each object's children (those of the entity under 0), and how the map's
-- orders compare.
local function merge_fields(spec)
  local fields, children = {}, {[0] = {}}
  for i, f in ipairs(spec.merge) do
    fields[i] = {name = f[1], key = f[2], object = f[4], quoted = json_quote(f[1]) .. ':'}
    children[i] = {}
    table.insert(children[f[3]], i)
  end
  local compare = after
  if spec.digits then compare = digits_after end
  return {fields = fields, children = children, after = compare}
end

-- Reads {key: [a, b], ...} of a state's text at i into into (leaves: {order, value};
-- objects: {set, nulled}); the index just past it. Each key stays the JSON string the
-- state holds, quotes included.
local function merge_pairs(text, i, into, leaves)
  i = i + 1
  while string.byte(text, i) ~= 125 do
    local j = json_string_end(text, i)
    local key = string.sub(text, i, j - 1)
    i = j + 2
    j = json_value_end(text, i)
    local a = json_text_or_nil(string.sub(text, i, j - 1))
    i = j + 1
    j = json_value_end(text, i)
    local b = string.sub(text, i, j - 1)
    if leaves then
      into[key] = {order = a, value = b}
    else
      into[key] = {set = a, nulled = json_text_or_nil(b)}
    end
    i = j + 1
    if string.byte(text, i) == 44 then i = i + 1 end
  end
  return i + 1
end

-- A state's text read in one pass. States are written compact, by orjson or by
-- merge_render: no space between their tokens.
local function merge_state(text)
  local st = {leaves = {}, objects = {}}
  if text == nil then return st end
  local i = 2
  while string.byte(text, i) ~= 125 do
    local j = json_string_end(text, i)
    local name = string.sub(text, i + 1, j - 2)
    i = j + 1
    if name == 'l' then
      i = merge_pairs(text, i, st.leaves, true)
    elseif name == 'o' then
      i = merge_pairs(text, i, st.objects, false)
    else
      j = json_value_end(text, i)
      if name == 'd' or name == 'e' then st[name] = json_text_or_nil(string.sub(text, i, j - 1)) end
      i = j
    end
    if string.byte(text, i) == 44 then i = i + 1 end
  end
  return st
end

local function set_leaf(st, key, order, value)
  local leaf = st.leaves[key]
  if leaf == nil or st.after(order, leaf.order) then
    st.leaves[key] = {order = order, value = value}
  end
end

local function object_entry(st, key)
  local entry = st.objects[key]
  if entry == nil then
    entry = {}
    st.objects[key] = entry
  end
  return entry
end

-- Records what the object in text (nulls left out) sets under field parent, at order.
local function merge_patch(m, parent, text, order, st)
  local _, members = json_members(text)
  for _, i in ipairs(m.children[parent]) do
    local f = m.fields[i]
    local v = members[f.name]
    if v ~= nil then
      if not f.object then
        set_leaf(st, f.key, order, v)
      elseif v ~= 'null' then
        local entry = object_entry(st, f.key)
        entry.set = later_of(st, order, entry.set)
        merge_patch(m, i, v, order, st)
      end
    end
  end
end

-- The members under field parent that count after cutoff, as the entity's JSON; drops
-- from the state what does not count: no later event can bring it back.
local function merge_build(m, parent, cutoff, st)
  local out = {}
  for _, i in ipairs(m.children[parent]) do
    local f = m.fields[i]
    if not f.object then
      local leaf = st.leaves[f.key]
      if leaf ~= nil then
        if not counts(st, leaf.order, cutoff) then
          st.leaves[f.key] = nil
        elseif leaf.value ~= 'null' then
          out[#out + 1] = f.quoted .. leaf.value
        end
      end
    else
      local entry = st.objects[f.key]
      local kept = entry ~= nil
      entry = entry or {}
      if not counts(st, entry.nulled, cutoff) then entry.nulled = nil end
      local own = later_of(st, entry.nulled, cutoff)
      if not counts(st, entry.set, own) then entry.set = nil end
      local inner = merge_build(m, i, own, st)
      if entry.set ~= nil then
        out[#out + 1] = f.quoted .. inner
      elseif kept and entry.nulled == nil then
        st.objects[f.key] = nil
      end
    end
  end
  return '{' .. table.concat(out, ',') .. '}'
end

-- The state's text, compact. The leaves an event set share its order: each order is
-- quoted once.
local function merge_render(st)
  local quoted = {}
  local function quote(order)
    if order == nil then return 'null' end
    local q = quoted[order]
    if q == nil then
      q = json_quote(order)
      quoted[order] = q
    end
    return q
  end
  local text = '{"d":' .. quote(st.d) .. ',"e":' .. quote(st.e)
  local leaves = {}
  for k, leaf in pairs(st.leaves) do
    leaves[#leaves + 1] = k .. ':[' .. quote(leaf.order) .. ',' .. leaf.value .. ']'
  end
  if #leaves > 0 then text = text .. ',"l":{' .. table.concat(leaves, ',') .. '}' end
  local objects = {}
  for k, o in pairs(st.objects) do
    objects[#objects + 1] = k .. ':[' .. quote(o.set) .. ',' .. quote(o.nulled) .. ']'
  end
  if #objects > 0 then text = text .. ',"o":{' .. table.concat(objects, ',') .. '}' end
  return text .. '}'
end

-- One event into a key's state: state is its text (nil: none yet, seeded from the entity's
-- text when there is one, every member set before any event), payload the event's
-- entity JSON (nil: a delete), nulls the depth-first numbers of the fields it sets to null
-- ('' for none). Returns the state's text after it, and the entity's (nil: none).
local function merge_fold(m, state, entity, order, payload, nulls)
  local st = merge_state(state)
  st.after = m.after
  if state == nil and entity ~= nil then
    st.e = MERGE_SEED
    merge_patch(m, 0, entity, MERGE_SEED, st)
  end
  if payload == nil then
    st.d = later_of(st, order, st.d)
  else
    st.e = later_of(st, order, st.e)
    merge_patch(m, 0, payload, order, st)
    for i in string.gmatch(nulls, '%d+') do
      local f = m.fields[tonumber(i) + 1]
      if f.object then
        local entry = object_entry(st, f.key)
        entry.nulled = later_of(st, order, entry.nulled)
      else
        set_leaf(st, f.key, order, 'null')
      end
    end
  end
  local built = merge_build(m, 0, st.d, st)
  if counts(st, st.e, st.d) then return merge_render(st), built end
  return merge_render(st), nil
end
