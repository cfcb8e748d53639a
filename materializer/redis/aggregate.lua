-- The aggregate fold (part of the materializer library, after text.lua): one event into
-- a key's declared aggregates. What each aggregate means, and how its values are encoded
-- as text, is materializer.fold.aggregate's docstring; this is the fold the real-time path
-- applies. Its state is AggregateFolder's: {"p": {"topic:partition": offset}, "n": events
-- folded since the entity began, "v": [encoded aggregate, ...]} ("v" left out when
-- deleted). Integers and decimals are added as digit strings: Lua's numbers are doubles,
-- which hold neither a long past 2^53 nor a decimal's digits.

-- A digit string's sign (true: negative) and its digits without leading zeros.
local function magnitude(a)
  local sign, digits = string.match(a, '^([-+]?)0*(%d*)$')
  if digits == nil then error('MATERIALIZER_AGGREGATE not an integer: ' .. a) end
  if digits == '' then return false, '0' end
  return sign == '-', digits
end

local function magnitude_less(a, b)
  if #a ~= #b then return #a < #b end
  return digits_after(b, a)
end

-- Integers of at most 15 characters are exact as doubles, and so is their sum.
local SHORT = 15

-- a + b, or a - b (a >= b), of digit strings without signs, seven digits at a time.
local function magnitude_sum(a, b, minus)
  local out, carry, i, j = {}, 0, #a, #b
  while i > 0 or j > 0 do
    local x = tonumber(string.sub(a, math.max(1, i - 6), math.max(0, i))) or 0
    local y = tonumber(string.sub(b, math.max(1, j - 6), math.max(0, j))) or 0
    local s
    if minus then s = x - y - carry else s = x + y + carry end
    carry = 0
    if s < 0 then
      s, carry = s + 10000000, 1
    elseif s >= 10000000 then
      s, carry = s - 10000000, 1
    end
    table.insert(out, 1, string.format('%07d', s))
    i, j = i - 7, j - 7
  end
  if carry > 0 then table.insert(out, 1, '1') end
  local digits = string.match(table.concat(out), '^0*(%d*)$')
  if digits == '' then return '0' end
  return digits
end

-- The sum of two integers of any size, as digit strings.
local function int_add(a, b)
  if #a <= SHORT and #b <= SHORT then
    return string.format('%.0f', tonumber(a) + tonumber(b))
  end
  local na, ma = magnitude(a)
  local nb, mb = magnitude(b)
  local negative, digits
  if na == nb then
    negative, digits = na, magnitude_sum(ma, mb, false)
  elseif magnitude_less(ma, mb) then
    negative, digits = nb, magnitude_sum(mb, ma, true)
  else
    negative, digits = na, magnitude_sum(ma, mb, true)
  end
  if digits == '0' or not negative then return digits end
  return '-' .. digits
end

local function int_less(a, b)
  if #a <= SHORT and #b <= SHORT then return tonumber(a) < tonumber(b) end
  local na, ma = magnitude(a)
  local nb, mb = magnitude(b)
  if ma == '0' and mb == '0' then return false end
  if na ~= nb then return na end
  if na then return magnitude_less(mb, ma) end
  return magnitude_less(ma, mb)
end

-- A decimal's digits without its point, and its scale; in plain notation or with an
-- exponent (a restored entity's decimal is written as Python writes it, 0E-18 for zero).
local function unscaled(a)
  local whole, fraction, exponent = string.match(a, '^([-+]?%d*)%.?(%d*)[eE]?([-+]?%d*)$')
  if whole == nil then error('MATERIALIZER_AGGREGATE not a decimal: ' .. a) end
  local scale = #fraction - (tonumber(exponent) or 0)
  if scale >= 0 then return whole .. fraction, scale end
  return whole .. fraction .. string.rep('0', -scale), 0
end

local function scaled(digits, from, to)
  return digits .. string.rep('0', to - from)
end

local function decimal_add(a, b)
  local da, sa = unscaled(a)
  local db, sb = unscaled(b)
  local scale = math.max(sa, sb)
  local sum = int_add(scaled(da, sa, scale), scaled(db, sb, scale))
  if scale == 0 then return sum end
  local negative, digits = magnitude(sum)
  digits = string.rep('0', scale + 1 - #digits) .. digits
  local text = string.sub(digits, 1, -scale - 1) .. '.' .. string.sub(digits, -scale)
  if negative then return '-' .. text end
  return text
end

-- The exponent of a plain decimal's most significant digit (Python's Decimal.adjusted).
local function adjusted(a)
  local digits, scale = unscaled(a)
  local _, m = magnitude(digits)
  if m == '0' then return -scale end
  return #m - 1 - scale
end

local function decimal_less(a, b)
  local da, sa = unscaled(a)
  local db, sb = unscaled(b)
  local scale = math.max(sa, sb)
  return int_less(scaled(da, sa, scale), scaled(db, sb, scale))
end

-- A double as text that reads back as the same double: the shortest of 15 to 17
-- significant digits, with a point when it has neither one nor an exponent.
local function float_text(x)
  if x ~= x then return 'NaN' end
  if x == math.huge then return 'Infinity' end
  if x == -math.huge then return '-Infinity' end
  local text
  for precision = 15, 17 do
    text = string.format('%.' .. precision .. 'g', x)
    if tonumber(text) == x then break end
  end
  if not string.find(text, '[.en]') then text = text .. '.0' end
  return text
end

-- The sort key of a double: NaN above every other value, as in Spark SQL.
local function float_less(a, b)
  local x, y = tonumber(a), tonumber(b)
  if x ~= x then return false end
  if y ~= y then return true end
  return x < y
end

local function number_of(text)
  return string.match(text, '^(%S+)')
end

local LESS = {
  int = int_less, decimal = decimal_less, float = float_less,
  str = function(a, b) return after(b, a) end,
  bool = function(a, b) return a == 'false' and b == 'true' end,
  day = function(a, b) return int_less(number_of(a), number_of(b)) end,
}
LESS.micros = LESS.day

-- Days since the epoch of a proleptic Gregorian date.
local function epoch_day(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end

-- A date's or timestamp's encoding (its number, a space, its JSON) from the JSON text its
-- entity shows, as the fold encodes its input.
local function time_encoded(kind, raw)
  local text = json_string(raw, 1)
  local y, m, d, rest = string.match(text, '^(%d%d%d%d)-(%d%d)-(%d%d)(.*)$')
  if y == nil then error('MATERIALIZER_AGGREGATE not a date: ' .. text) end
  local days = epoch_day(tonumber(y), tonumber(m), tonumber(d))
  if kind == 'day' then return string.format('%d {"v":%s}', days, raw) end
  local h, mi, s, fraction, zone = string.match(rest, '^T(%d%d):(%d%d):(%d%d)%.?(%d*)(.*)$')
  if h == nil then error('MATERIALIZER_AGGREGATE not a timestamp with seconds: ' .. text) end
  local seconds = days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(s)
  local sign, zh, zm = string.match(zone, '^([-+])(%d%d):(%d%d)$')
  if sign == nil and zone ~= 'Z' then
    error('MATERIALIZER_AGGREGATE a time zone other than Z or +hh:mm: ' .. text)
  end
  if sign then
    local offset = tonumber(zh) * 3600 + tonumber(zm) * 60
    if sign == '+' then seconds = seconds - offset else seconds = seconds + offset end
  end
  fraction = string.sub(fraction .. '000000', 1, 6)
  local micros = int_add(string.format('%d', seconds) .. '000000', fraction)
  return micros .. ' {"v":' .. raw .. '}'
end

-- The map's aggregates from its spec (AggregateFolder.lua_spec): per aggregate its name,
-- function, kind, its input's place in the payload (-1: none) and, for a decimal sum,
-- its integer digits at most (-1: no bound).
local function aggregate_specs(spec)
  local out = {}
  for i, a in ipairs(spec) do
    out[i] = {name = a[1], fn = a[2], kind = a[3], at = a[4], digits = a[5],
      quoted = json_quote(a[1]) .. ':'}
  end
  return out
end

-- The state read with cjson: offsets and the count are below 2^53, exact as doubles.
local function aggregate_state(text)
  local st = {p = {}, n = 0}
  if text == nil then return st end
  local decoded = cjson.decode(text)
  st.p, st.n = decoded.p, decoded.n
  if decoded.v ~= nil and decoded.v ~= cjson.null then
    st.v = {}
    for i, v in ipairs(decoded.v) do st.v[i] = v ~= cjson.null and v end
  end
  return st
end

-- The state an entity without one starts from: its aggregates as it shows them, counted
-- as one event folded before (so first stays), no offsets.
local function aggregate_seed(specs, entity)
  local st = {p = {}, n = 1, v = {}}
  local _, shown = json_members(entity)
  for i, a in ipairs(specs) do
    local raw = shown[a.name]
    local v = false
    if raw ~= nil and raw ~= 'null' then
      if a.kind == 'json' then
        v = '{"v":' .. raw .. '}'
      elseif a.kind == 'day' or a.kind == 'micros' then
        v = time_encoded(a.kind, raw)
      elseif string.byte(raw, 1) == 34 then
        v = json_string(raw, 1)
      else
        v = raw
      end
    end
    st.v[i] = v
  end
  return st
end

-- One aggregate's encoded value (false: none) after one event's input (false: null).
local function aggregate_one(a, current, input, fresh)
  if a.fn == 'count' then
    local add = (a.at < 0 or input) and '1' or '0'
    return int_add(current or '0', add)
  end
  if a.fn == 'last' then return input end
  if a.fn == 'first' then
    if fresh then return input end
    return current
  end
  if not input then return current end
  if not current then
    -- A sum starts from its first value written as sums are (a restored 0E-18 is 0.000…).
    if a.fn == 'sum' and a.kind == 'float' then return float_text(tonumber(input)) end
    if a.fn == 'sum' and a.kind == 'decimal' then return decimal_add(input, '0') end
    return input
  end
  if a.fn == 'sum' then
    if a.kind == 'int' then return int_add(current, input) end
    if a.kind == 'decimal' then return decimal_add(current, input) end
    return float_text(tonumber(current) + tonumber(input))
  end
  local less = LESS[a.kind]
  if a.fn == 'min' and less(input, current) then return input end
  if a.fn == 'max' and less(current, input) then return input end
  return current
end

local LONG_MIN, LONG_END = '-9223372036854775808', '9223372036854775808'

-- An aggregate's value as the entity's JSON shows it (nil: left out).
local function aggregate_shown(a, text)
  local kind = a.kind
  if kind == 'json' or kind == 'day' or kind == 'micros' then
    local inner = string.match(text, '{"v":(.*)}$')
    if inner == nil or inner == '' then return nil end
    return inner
  end
  if kind == 'count' or kind == 'int' then
    if int_less(text, LONG_MIN) or not int_less(text, LONG_END) then return nil end
    return text
  end
  if kind == 'float' then
    local x = tonumber(text)
    if x ~= x or x == math.huge or x == -math.huge then return json_quote(text) end
    return float_text(x)
  end
  if kind == 'decimal' then
    if a.digits >= 0 and adjusted(text) >= a.digits then return nil end
    return text
  end
  if kind == 'bool' then return text end
  return json_quote(text)
end

local function aggregate_render(specs, st)
  local offsets = {}
  for place, offset in pairs(st.p) do
    offsets[#offsets + 1] = json_quote(place) .. ':' .. string.format('%.0f', offset)
  end
  local text = '{"p":{' .. table.concat(offsets, ',') .. '},"n":' .. string.format('%.0f', st.n)
  if st.v == nil then return text .. '}', nil end
  local values, members = {}, {}
  for i, a in ipairs(specs) do
    local v = st.v[i]
    values[i] = v or cjson.null
    local shown = nil
    if v then shown = aggregate_shown(a, v) end
    if shown ~= nil then members[#members + 1] = a.quoted .. shown end
  end
  return text .. ',"v":' .. cjson.encode(values) .. '}', '{' .. table.concat(members, ',') .. '}'
end

-- One event into a key's state: state is its text (nil: none yet, seeded from the entity's
-- text when there is one), place its source partition ("topic:partition") and offset,
-- payload the inputs' JSON array (nil: a delete). Returns the state's text after it (nil:
-- folded before, unchanged) and the entity's (nil: none).
local function aggregate_fold(specs, state, entity, place, offset, payload)
  local st
  if state == nil and entity ~= nil then
    st = aggregate_seed(specs, entity)
  else
    st = aggregate_state(state)
  end
  local last = st.p[place]
  offset = tonumber(offset)
  if last ~= nil and last >= offset then return nil, nil end
  st.p[place] = offset
  if payload == nil then
    st.n, st.v = 0, nil
  else
    local inputs = json_elements(payload)
    local fresh = st.n == 0
    st.v = st.v or {}
    for i, a in ipairs(specs) do
      local input = a.at >= 0 and json_text_or_nil(inputs[a.at + 1]) or false
      st.v[i] = aggregate_one(a, st.v[i] or false, input, fresh) or false
    end
    st.n = st.n + 1
  end
  return aggregate_render(specs, st)
end
