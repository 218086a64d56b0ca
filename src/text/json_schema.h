// text/json_schema: a JSON Schema (draft 2020-12 and the drafts OpenAI's structured outputs
// accept) compiled to a Grammar whose every whole text is a JSON document that validates
// against it (issue #33's response_format json_schema, guided_json and tool arguments).
//
// Supported: type (one or a list), properties (written in the schema's order; a property not
// in `required` may be left out), required, additionalProperties (with no properties: free
// keys with values of that schema; with properties no others are written), items, minItems,
// maxItems, enum, const, anyOf, oneOf (as anyOf: write schemas whose branches do not overlap),
// allOf of one schema, $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion too, up to
// the grammar's depth), minLength, maxLength, pattern, format (date, time,
// date-time, email, uuid, ipv4, ipv6 is refused), minimum, maximum, exclusiveMinimum,
// exclusiveMaximum (numbers with bounds are written without an exponent). Annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are
// ignored. Every other keyword the draft defines (not, if/then/else, patternProperties,
// uniqueItems: true, multipleOf, prefixItems, ...) is refused: InvalidArgument naming it and
// where it is ("json_schema: 'not' (at /properties/a) is not supported"). A keyword no draft
// defines is ignored, as validators do (OpenAPI's `nullable` among them: write "type": [..., "null"]).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "text/grammar.h"

namespace lmserve::text {

Result<std::shared_ptr<const Grammar>> compile_json_schema(const nlohmann::ordered_json& schema);

// Adds a schema's nodes to a grammar being built (tool calls: a function's parameters inside
// the call's text); returns the node of the schema's value. `document` resolves "#..." refs.
Result<std::int32_t> add_json_schema(Grammar& grammar, const nlohmann::ordered_json& schema, const nlohmann::ordered_json& document);

}  // namespace lmserve::text
