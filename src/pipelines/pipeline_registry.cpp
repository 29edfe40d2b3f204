// The registry over the families (src/families/registry.cpp lists them): the flat, sorted list of classes,
// their siblings, and the generic field check every class makes.
#include "kiln/pipelines/pipeline_registry.h"

#include <algorithm>
#include <map>
#include <set>

#include "kiln/pipelines/request_fields.h"
#include "pipelines/call_generators.h"
#include "pipelines/pipeline_common.h"

namespace kiln {

// Defined by src/families/registry.cpp, the one list of families (the layer above the pipelines provides it).
std::vector<Family> registered_families();

namespace {

// "A, B and C".
std::string listed(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

// The family's class of `task` that loads the folders `of` runs from (itself included).
std::string sibling_of(const Family& family, const PipelineClass& of, Task task) {
  for (const PipelineClass& c : family.classes) {
    if (c.task != task) continue;
    if (c.name == of.name ||
        std::find(c.loads_folders_of.begin(), c.loads_folders_of.end(), of.name) != c.loads_folders_of.end())
      return c.name;
  }
  return "";
}

// The registered families with each class pointing to its family and its siblings. The pointers stay valid
// when the vector is moved (a moved vector keeps its elements where they are).
std::vector<Family> wired(std::vector<Family> families) {
  std::set<std::string> names;
  for (Family& family : families) {
    for (PipelineClass& c : family.classes) {
      KILN_CHECK(names.insert(c.name).second, "internal: pipeline class " << c.name << " registered twice");
      for (const std::string& field : c.fields) request_field(field);  // throws for a misspelt field
      c.family = &family;
      // A folder of a class that starts from noise (or edits with the image as context, as Kontext does) runs
      // its family's image-to-image and inpainting classes too.
      if (!c.edits_an_image()) {
        c.image_to_image = sibling_of(family, c, Task::ImageToImage);
        c.inpainting = sibling_of(family, c, Task::Inpainting);
      } else if (c.task == Task::ImageToImage) {
        c.inpainting = sibling_of(family, c, Task::Inpainting);  // an image-to-image folder given a mask
      }
    }
  }
  return families;
}

// Who takes `field` besides `self`: the classes of its family that do; else the classes of other families
// that do, when there are a few, or their families.
std::string takers(const PipelineClass& self, const std::string& field) {
  const auto taking = [&](const Family& family) {
    std::vector<std::string> names;
    for (const PipelineClass& c : family.classes)
      if (c.takes(field)) names.push_back(c.name);
    return names;
  };
  const auto does = [](const std::vector<std::string>& names) {
    return listed(names) + (names.size() == 1 ? " does" : " do");
  };
  if (const std::vector<std::string> own = taking(*self.family); !own.empty()) return does(own);
  std::vector<std::string> classes, other_families;
  for (const Family& f : families())
    if (const std::vector<std::string> names = taking(f); !names.empty()) {
      classes.insert(classes.end(), names.begin(), names.end());
      other_families.push_back(f.name);
    }
  if (classes.empty()) return "no pipeline Kiln runs does";
  if (classes.size() <= 3) return does(classes);
  return "the " + listed(other_families) + " pipelines do";
}

// A text a form or a client sends for a field left blank ("") is not a value the class must refuse.
bool given(const RequestField& field, const PipelineRequest& request) {
  if (!field.is_set(request)) return false;
  if (field.kind != FieldKind::Text) return true;
  return !std::get<std::string>(field.get(request)).empty();
}

}  // namespace

const char* task_name(Task task) {
  switch (task) {
    case Task::TextToImage:
      return "text-to-image";
    case Task::ImageToImage:
      return "image-to-image";
    case Task::Inpainting:
      return "inpainting";
    case Task::Fill:
      return "fill";
    case Task::ImageEditing:
      return "image editing";
  }
  return "?";
}

const std::vector<Family>& families() {
  static const std::vector<Family> all = wired(registered_families());
  return all;
}

const std::vector<const PipelineClass*>& pipeline_classes() {
  static const std::vector<const PipelineClass*> sorted = [] {
    std::vector<const PipelineClass*> out;
    for (const Family& family : families())
      for (const PipelineClass& c : family.classes) out.push_back(&c);
    std::sort(out.begin(), out.end(),
              [](const PipelineClass* a, const PipelineClass* b) { return a->name < b->name; });
    return out;
  }();
  return sorted;
}

const PipelineClass* find_pipeline_class(std::string_view name) {
  for (const PipelineClass* c : pipeline_classes())
    if (c->name == name) return c;
  return nullptr;
}

const PipelineClass& pipeline_class(const std::string& name, const std::string& where) {
  if (const PipelineClass* c = find_pipeline_class(name)) return *c;
  std::vector<std::string> known;
  for (const PipelineClass* c : pipeline_classes()) known.push_back(c->name);
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  KILN_FAIL(where << ": pipeline class '" << name << "' is not supported (Kiln runs " << list << ")");
}

bool PipelineClass::takes(std::string_view field) const {
  return std::find(fields.begin(), fields.end(), field) != fields.end();
}

bool PipelineClass::edits_an_image() const {
  return task == Task::ImageToImage || task == Task::Inpainting || task == Task::Fill;
}

void PipelineClass::check_fields(const PipelineRequest& request) const {
  const char* pipeline = name.c_str();
  for (const RequestField& field : request_fields())
    if (!takes(field.name) && given(field, request))
      throw RequestError(field.name, name + " takes no " + field.name + " (" + field.help + "); " +
                                         takers(*this, field.name));
  try {
    check_field_ranges(request);
  } catch (const RequestError& e) {
    throw RequestError(e.field(), name + ": " + e.what());
  }
  if (request.cache && *request.cache != "none") {
    try {
      parse_step_cache(*request.cache);
    } catch (const Error& e) {
      throw RequestError("cache", e.what());
    }
  }
  pipelines::check_embedding_fields(pipeline, request);
  pipelines::check_prompt_list(pipeline, request);
  pipelines::check_generators(pipeline, request);
  switch (task) {
    case Task::ImageToImage:
      pipelines::check_edit_inputs(pipeline, request, false);
      break;
    case Task::Inpainting:
    case Task::Fill:
      pipelines::check_edit_inputs(pipeline, request, true);
      break;
    case Task::ImageEditing:
      pipelines::refuse(max_images > 0 && request.image.size() > max_images, "image",
                        name + " edits " +
                            (max_images == 1 ? "one image" : std::to_string(max_images) + " images") +
                            " at most, got " + std::to_string(request.image.size()));
      pipelines::refuse(request.image.size() < min_images, "image",
                        name + " edits an image: give the image to edit (image; kiln generate --image)");
      break;
    case Task::TextToImage:
      break;
  }
}

const PipelineClass& class_for_images(const PipelineClass& folder, bool mask) {
  if (folder.edits_an_image() && !(mask && folder.task == Task::ImageToImage && !folder.inpainting.empty()))
    return folder;
  const Task task = mask ? Task::Inpainting : Task::ImageToImage;
  const std::string& sibling = mask ? folder.inpainting : folder.image_to_image;
  if (!sibling.empty()) return pipeline_class(sibling, folder.name);
  std::vector<std::string> with;  // the families whose folders have one
  for (const Family& family : families())
    for (const PipelineClass& c : family.classes)
      if (c.task == task) {
        with.push_back(family.name);
        break;
      }
  throw RequestError(mask ? "mask_image" : "image", folder.name + " has no " + task_name(task) +
                                                        " pipeline (" + listed(with) + " folders have)");
}

std::unique_ptr<DiffusionPipeline> pipeline_from_pipe(const PipelineClass& target,
                                                      const DiffusionPipeline& pipe) {
  const PipelineClass& source = pipe.registered_class();
  const auto lists = [](const PipelineClass& c, const std::string& name) {
    return std::find(c.loads_folders_of.begin(), c.loads_folders_of.end(), name) != c.loads_folders_of.end();
  };
  const bool same_folders =
      target.family == source.family &&
      (target.name == source.name || lists(target, source.name) || lists(source, target.name));
  KILN_CHECK(same_folders && target.from_pipe,
             target.name << " cannot be made from a " << source.name
                         << " (from_pipe shares the components of a "
                         << "class that runs the same folders"
                         << (target.family == source.family ? "; " + target.name + " loads its own checkpoint"
                                                            : ", of one family")
                         << ")");
  return target.from_pipe(pipe);
}

SingleFilePipeline single_file_pipeline(const std::string& path) {
  std::string runs;
  for (const Family& family : families()) {
    if (!family.single_file) continue;
    if (std::optional<SingleFilePipeline> found = family.single_file(path)) return *found;
    runs += (runs.empty() ? "" : ", ") + family.name;
  }
  KILN_FAIL(path << ": not a whole pipeline in one file that Kiln runs (" << runs
                 << " single files); a transformer alone goes beside its model's folder (--transformer FILE "
                    "--model FOLDER)");
}

}  // namespace kiln
