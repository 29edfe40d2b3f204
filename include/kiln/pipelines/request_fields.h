// Every field of a PipelineRequest, declared once: its diffusers name, its kind, its range, one line of help
// and the names it goes by in `kiln generate` (a flag) and `kiln serve` (a JSON field). Everything that reads
// a request from outside derives from this table instead of listing fields itself:
//   - a pipeline class says which fields it takes (PipelineClass::fields); a field it does not take is
//     refused by one rule, naming the class, the field and the classes that do take it
//     (check_taken_fields);
//   - the ranges are checked once, before anything loads (check_field_ranges);
//   - kiln generate's flags, kiln serve's JSON, the Python keyword arguments and the web page's form (the
//     schema the server serves) are made from it, each converting its input by the field's kind;
//   - the key that orders calls under tensor parallelism hashes every field (request_key), so none can be
//     left out.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/pipelines/pipeline_request.h"

namespace kiln {

enum class FieldKind {
  Text,           // a string (its size bounded by `max`, in bytes)
  TextList,       // several strings (each bounded as Text)
  Integer,        // within [min, max]
  IntegerList,    // each within [min, max]
  Number,         // finite, within [min, max]
  Boolean,        // true or false
  Choice,         // one of `choices`
  Image,          // an image (RGB, gray or RGBA)
  ImageList,      // several images
  Tensor,         // an array (prompt embeddings)
  Generator,      // a random generator (from a seed, or a torch.Generator's state)
  GeneratorList,  // one generator per image
};
// "text", "text list", "integer", "integer list", "number", "boolean", "choice", "image", "image list",
// "tensor", "generator", "generator list".
const char* field_kind_name(FieldKind kind);

// A field's value, by kind: Text and Choice hold a string, Integer an int64_t, Number a double.
using FieldValue = std::variant<std::string, std::vector<std::string>, int64_t, std::vector<int64_t>, double,
                                bool, Image, std::vector<Image>, Tensor, Generator, std::vector<Generator>>;

struct RequestField {
  std::string name;  // diffusers' keyword argument, "num_inference_steps"; RequestError::field() names it
  FieldKind kind = FieldKind::Text;
  std::string label;  // a few words for a form or a caption: "Steps"
  std::string help;   // one line: what it does
  // Integer, IntegerList and Number: the inclusive bounds; Text and TextList: `max` is the size in bytes.
  std::optional<double> min, max;
  // A Number whose bounds themselves are out of range (denoising_end's (0, 1)).
  bool open = false;
  std::vector<std::string> choices;  // Choice: the names it takes
  std::string flag;                  // kiln generate's flag ("--steps"); empty: no flag
  std::string json;                  // kiln serve's JSON field ("steps"); empty: not served
  std::string keyword;               // the Python keyword when not `name` ("_auto_resize"); else empty
  // The field that takes a list where this one takes one value, as diffusers' `prompt: str | list[str]` does
  // ("prompts" for "prompt", "generators" for "generator"); empty when there is none.
  std::string list_form;

  // Access to the request, whatever the member's C++ type. A field is set when it differs from a
  // default-constructed PipelineRequest (an optional with a value, a list with elements, a defined tensor, a
  // number other than its default).
  std::function<bool(const PipelineRequest&)> is_set;
  std::function<FieldValue(const PipelineRequest&)> get;
  // Sets the field from a value of its kind, checked against its range: RequestError naming the field when
  // the value is of another kind or out of range.
  std::function<void(PipelineRequest&, const FieldValue&)> set;
  std::function<void(PipelineRequest&)> reset;

  // Whether `v` is finite and within the bounds (open ones excluded).
  bool within(double v) const;
  // The name callers use for the field in Python (keyword, else name).
  const std::string& python_name() const { return keyword.empty() ? name : keyword; }
  // What the field accepts: "an integer between 1 and 1000", "a number, in [0, 1]", "text of at most 65536
  // bytes", ..., for help and the schema.
  std::string accepted() const;
  // Its bounds as a range errors say it: "between 1 and 1000", "a finite value >= 0", "in [0, 1]"; empty
  // when it has none.
  std::string range() const;
};

// Every field, in the order of PipelineRequest.
const std::vector<RequestField>& request_fields();
// The field named `name` (its diffusers name or its Python keyword), or null.
const RequestField* find_request_field(std::string_view name);
// The same, throwing kiln::Error naming the fields there are when there is none.
const RequestField& request_field(std::string_view name);

// Checks a value against the field's kind and range without setting it (what `set` checks): RequestError
// naming the field.
void check_field_value(const RequestField& field, const FieldValue& value);
// Every set field of `request` within its range (RequestError naming the first that is not).
void check_field_ranges(const PipelineRequest& request);

// The fields `request` sets, in table order.
std::vector<const RequestField*> fields_set(const PipelineRequest& request);

// The value `field` takes when a request leaves it unset, from a pipeline's defaults (PipelineDefaults: the
// size, steps, guidance, tokens, strength); nullopt for a field whose default is not one of those.
std::optional<FieldValue> default_of(const PipelineDefaults& defaults, const std::string& field);

}  // namespace kiln
