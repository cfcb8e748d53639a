-- Text as the folds compare and read it (the first part of the materializer library).

-- Whether a sorts after b byte by byte: Lua's own '<' on strings follows the server's
-- locale (strcoll), the fold's orders follow bytes, as Spark compares strings.
local function after(a, b)
  if a == b then return false end
  local n = math.min(#a, #b)
  if string.sub(a, 1, n) == string.sub(b, 1, n) then return #a > #b end
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if string.sub(a, 1, mid) == string.sub(b, 1, mid) then lo = mid + 1 else hi = mid end
  end
  return string.byte(a, lo) > string.byte(b, lo)
end

-- Whether a sorts after b, for strings of digits and zero bytes only (the orders of a map
-- without an event-time string): those collate as their bytes in every locale, so Lua's
-- '>' compares them without a copy.
local function digits_after(a, b)
  return a > b
end

-- JSON read without bending a value. Redis's cjson reads every number as a double, which
-- holds neither a long past 2^53 nor a decimal's digits: these functions find where a
-- value ends and what an object's members are, and keep each member's value as the text
-- it was written in.

local function json_space(s, i)
  return string.find(s, '[^ \t\r\n]', i) or (#s + 1)
end

-- The index just past the string whose opening quote is at i. Found by plain finds of the
-- next quote (a pattern tries each character in turn, tens of times slower on long text),
-- a quote escaped when an odd number of backslashes comes before it.
local function json_string_end(s, i)
  local j = i + 1
  while true do
    local q = string.find(s, '"', j, true)
    if not q then error('MATERIALIZER_JSON an unterminated string') end
    local k = q - 1
    while string.byte(s, k) == 92 do k = k - 1 end
    if (q - 1 - k) % 2 == 0 then return q + 1 end
    j = q + 1
  end
end

-- The index just past the value that starts at i.
local function json_value_end(s, i)
  local b = string.byte(s, i)
  if b == 34 then return json_string_end(s, i) end
  if b ~= 123 and b ~= 91 then
    return string.find(s, '[,}%] \t\r\n]', i) or (#s + 1)
  end
  local depth, j = 0, i
  while true do
    local k = string.find(s, '[%[%]{}"]', j)
    if not k then error('MATERIALIZER_JSON an unterminated object or array') end
    local c = string.byte(s, k)
    if c == 34 then
      j = json_string_end(s, k)
    else
      if c == 123 or c == 91 then depth = depth + 1 else depth = depth - 1 end
      j = k + 1
      if depth == 0 then return j end
    end
  end
end

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then
    return string.char(0xC0 + math.floor(cp / 0x40), 0x80 + cp % 0x40)
  end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 0x1000), 0x80 + math.floor(cp / 0x40) % 0x40,
      0x80 + cp % 0x40)
  end
  return string.char(0xF0 + math.floor(cp / 0x40000), 0x80 + math.floor(cp / 0x1000) % 0x40,
    0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

local json_escapes = {['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f',
  n = '\n', r = '\r', t = '\t'}

-- The string whose opening quote is at i, unescaped, and the index just past it.
local function json_string(s, i)
  local j = json_string_end(s, i)
  local body = string.sub(s, i + 1, j - 2)
  if not string.find(body, '\\', 1, true) then return body, j end
  local out, k = {}, 1
  while k <= #body do
    local e = string.find(body, '\\', k, true)
    if not e then
      out[#out + 1] = string.sub(body, k)
      break
    end
    out[#out + 1] = string.sub(body, k, e - 1)
    local c = string.sub(body, e + 1, e + 1)
    if c == 'u' then
      local cp = tonumber(string.sub(body, e + 2, e + 5), 16)
      k = e + 6
      if cp >= 0xD800 and cp < 0xDC00 and string.sub(body, k, k + 1) == '\\u' then
        cp = 0x10000 + (cp - 0xD800) * 0x400 + tonumber(string.sub(body, k + 2, k + 5), 16)
          - 0xDC00
        k = k + 6
      end
      out[#out + 1] = utf8_char(cp)
    else
      out[#out + 1] = json_escapes[c]
      k = e + 2
    end
  end
  return table.concat(out), j
end

-- A string value's text unescaped; nil for the text null.
local function json_text_or_nil(text)
  if text == nil or text == 'null' then return nil end
  if not string.find(text, '\\', 1, true) then return string.sub(text, 2, -2) end
  return (json_string(text, 1))
end

local function json_escape(c)
  if c == '"' then return '\\"' end
  if c == '\\' then return '\\\\' end
  if c == '\n' then return '\\n' end
  return string.format('\\u%04x', string.byte(c))
end

-- s as a JSON string (nil: null).
local function json_quote(s)
  if s == nil then return 'null' end
  if not string.find(s, '[%c"\\]') then return '"' .. s .. '"' end
  return '"' .. (string.gsub(s, '[%c"\\]', json_escape)) .. '"'
end

-- The members of the object in text: their names in order, and each one's value as text.
-- With raw, each name is kept as the JSON string it was written as, quotes included.
local function json_members(text, raw)
  local names, values = {}, {}
  local i = json_space(text, 1)
  if string.byte(text, i) ~= 123 then error('MATERIALIZER_JSON not an object: ' .. text) end
  i = json_space(text, i + 1)
  if string.byte(text, i) == 125 then return names, values end
  while true do
    local j = json_string_end(text, i)
    local name = string.sub(text, i, j - 1)
    if not raw then name = json_text_or_nil(name) end
    i = json_space(text, json_space(text, j) + 1)
    j = json_value_end(text, i)
    names[#names + 1] = name
    values[name] = string.sub(text, i, j - 1)
    i = json_space(text, j)
    if string.byte(text, i) == 125 then return names, values end
    i = json_space(text, i + 1)
  end
end

-- The elements of the array in text, each as text.
local function json_elements(text)
  local out = {}
  local i = json_space(text, 1)
  if string.byte(text, i) ~= 91 then error('MATERIALIZER_JSON not an array: ' .. text) end
  i = json_space(text, i + 1)
  if string.byte(text, i) == 93 then return out end
  while true do
    local j = json_value_end(text, i)
    out[#out + 1] = string.sub(text, i, j - 1)
    i = json_space(text, j)
    if string.byte(text, i) == 93 then return out end
    i = json_space(text, i + 1)
  end
end
