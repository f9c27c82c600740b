// The C++ runtime as a Python extension: `jit2triton.load(path, runtime="cpp")` runs the whole plan here, with the
// GIL released, and only the inputs and outputs cross into Python.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>

#include "graph_admission.h"
#include "jit2triton/jit2triton.h"
#include "plan.h"

namespace py = pybind11;
using jit2triton::Error;

namespace {

// A Python list's element type as TorchScript declares it: Tensor for a list of tensors (of any shapes: a tensor's
// own type() carries its sizes, which made lists of differently sized tensors List[Any], and cost an allocation per
// item), the one type of its items otherwise, Any for a mixed list.
c10::TypePtr list_element_type(const std::vector<c10::IValue>& items) {
  if (items.empty() || std::all_of(items.begin(), items.end(), [](const c10::IValue& x) { return x.isTensor(); }))
    return c10::TensorType::get();
  c10::TypePtr elem = items[0].type();
  for (const auto& x : items)
    if (*x.type() != *elem) return c10::AnyType::get();
  return elem;
}

c10::IValue to_ivalue(py::handle obj, size_t index) {
  if (THPVariable_Check(obj.ptr())) return THPVariable_Unpack(obj.ptr());
  if (PyBool_Check(obj.ptr())) return obj.cast<bool>();
  if (PyLong_Check(obj.ptr())) return obj.cast<int64_t>();
  if (PyFloat_Check(obj.ptr())) return obj.cast<double>();
  if (PyUnicode_Check(obj.ptr())) return obj.cast<std::string>();
  if (obj.is_none()) return c10::IValue();
  if (PyTuple_Check(obj.ptr())) {
    std::vector<c10::IValue> items;
    for (auto x : obj) items.push_back(to_ivalue(x, index));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (PyList_Check(obj.ptr())) {
    std::vector<c10::IValue> items;
    for (auto x : obj) items.push_back(to_ivalue(x, index));
    c10::TypePtr elem = list_element_type(items);
    c10::impl::GenericList list(elem);
    for (auto& x : items) list.push_back(std::move(x));
    return list;
  }
  if (PyDict_Check(obj.ptr())) {
    std::vector<std::pair<c10::IValue, c10::IValue>> items;
    for (auto kv : py::reinterpret_borrow<py::dict>(obj)) items.emplace_back(to_ivalue(kv.first, index), to_ivalue(kv.second, index));
    c10::impl::GenericDict dict(items.empty() ? c10::StringType::get() : items[0].first.type(),
                                items.empty() ? c10::TensorType::get() : items[0].second.type());
    for (auto& [k, v] : items) dict.insert_or_assign(std::move(k), std::move(v));
    return dict;
  }
  throw Error(Error::Kind::Input, "input " + std::to_string(index) + ": a " + std::string(Py_TYPE(obj.ptr())->tp_name) +
                                      " cannot be passed to the model; pass tensors, numbers, strings, or lists, "
                                      "tuples and dicts of them");
}

const char* error_class(Error::Kind kind) {
  switch (kind) {
    case Error::Kind::CorruptPackage: return "CorruptPackageError";
    case Error::Kind::PackageVersion: return "PackageVersionError";
    case Error::Kind::PackageDevice: return "PackageDeviceError";
    case Error::Kind::Signature: return "SignatureError";
    case Error::Kind::Input: return "InputError";
    case Error::Kind::Step: return "StepError";
    case Error::Kind::ModelRaised: return "ModelRaisedError";
    case Error::Kind::QuantizedEngine: return "QuantizedEngineError";
    case Error::Kind::SizeChanged: return "SizeChangedError";
    default: return "PackageError";
  }
}

// Text from a package (a member's name, a message quoting one) as a Python str, whatever bytes a damaged file put in
// it: undecodable bytes become U+FFFD, never a UnicodeDecodeError in place of the refusal (found by the fuzz).
py::str text(const std::string& bytes) {
  return py::reinterpret_steal<py::str>(
      PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace"));
}

py::object to_python(const jit2triton::json::Value& v) {
  using Kind = jit2triton::json::Value::Kind;
  switch (v.kind) {
    case Kind::Bool: return py::bool_(v.boolean);
    case Kind::Int: return py::int_(v.integer);
    case Kind::Float: return py::float_(v.number);
    case Kind::String: return text(v.text);
    case Kind::Array: {
      py::list out;
      for (const auto& x : v.items) out.append(to_python(x));
      return out;
    }
    case Kind::Object: {
      py::dict out;
      for (const auto& [key, x] : v.members) out[text(key)] = to_python(x);
      return out;
    }
    default: return py::none();
  }
}

// A Python exception met in a call into Python (`doing`: what the runtime asked of it), as the runtime's own error:
// its class is the runtime's (a PackageDeviceError stays one, so that load falls back as it did), its message
// Python's.
[[noreturn]] void rethrow(py::error_already_set& err, const std::string& doing) {
  std::string name = py::str(err.type().attr("__name__"));
  std::string what = py::str(err.value());
  Error::Kind kind = name == "PackageDeviceError" ? Error::Kind::PackageDevice
                     : name == "CorruptPackageError" ? Error::Kind::CorruptPackage
                     : name == "SizeChangedError" ? Error::Kind::SizeChanged
                                                  : Error::Kind::Step;
  throw Error(kind, name == "PackageDeviceError" || name == "CorruptPackageError" || name == "SizeChangedError"
                        ? what : doing + " failed: " + name + ": " + what);
}

// Triton kernels on the CPU, for this extension's plans: Triton's interpreter in Python
// (deploy/triton_kernels.py, interpreted_for_cpp), called with the GIL taken for each launch. Each launcher's
// Python callable is held by a shared pointer that releases it under the GIL, as plan steps copy launchers while
// the GIL is released.
py::dict kernel_sources(const jit2triton::Package& pkg) {
  py::dict files;
  for (const auto& [name, data] : pkg.members)  // (the kernels' sources: not the weights, which may be large)
    if (name.compare(0, 8, "kernels/") == 0) files[text(name)] = py::bytes(data.data(), data.size());
  return files;
}

jit2triton::Launchers interpreted_kernels(const jit2triton::Package& pkg, c10::Device, int) {
  py::gil_scoped_acquire gil;
  jit2triton::Launchers out;
  try {
    py::dict files = kernel_sources(pkg);
    const jit2triton::json::Value& manifest = pkg.manifest;
    py::object section = manifest.find("triton") ? to_python(manifest.at("triton")) : py::none();
    py::dict made = py::module_::import("jit2triton.deploy.triton_kernels").attr("interpreted_for_cpp")(
        files, section, to_python(manifest.at("kernels")));
    for (const auto& meta : manifest.at("kernels").items) {
      const std::string& name = meta.at("name").as_string();
      size_t words = (meta.find("sizes") ? meta.at("sizes").size() : 0) +
                     (meta.optional("by_value") ? meta.at("by_value").size() : 0);
      std::shared_ptr<py::object> fn(new py::object(made[py::str(name)]), [](py::object* p) {
        py::gil_scoped_acquire again;
        delete p;
      });
      out[name] = [fn, words](std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
                              const int64_t* sizes) {
        py::gil_scoped_acquire held;
        try {
          py::list ins, outs, numbers;
          for (const auto& t : inputs) ins.append(t.defined() ? py::cast(t) : py::none());
          for (const auto& t : outputs) outs.append(py::cast(t));
          for (size_t i = 0; i < words; ++i) numbers.append(py::int_(sizes[i]));
          (*fn)(ins, outs, numbers);
        } catch (py::error_already_set& err) {
          rethrow(err, "a Triton kernel under Triton's interpreter");
        }
      };
    }
  } catch (py::error_already_set& err) {
    rethrow(err, "loading the Triton kernels under Triton's interpreter");
  }
  return out;
}

// A C++ kernel library built for another CPU, rebuilt for this one from the package's bundled source by the Python
// loader (deploy/cpp_kernels.py, usable_library: with its warning, or its error naming what to install).
std::string rebuilt_library(std::string_view library, std::string_view source, const std::string& isa) {
  py::gil_scoped_acquire gil;
  try {
    py::bytes out = py::module_::import("jit2triton.deploy.cpp_kernels").attr("usable_library")(
        py::bytes(library.data(), library.size()), text(std::string(source)), isa);
    return std::string(out);
  } catch (py::error_already_set& err) {
    rethrow(err, "rebuilding the C++ kernels for this CPU");
  }
}

// Cubins built for another GPU, rebuilt for this one by the Python loader (deploy/triton_kernels.py,
// rebuilt_for_cpp: with its warning, or its error naming what to install).
jit2triton::RebuiltCubins rebuilt_cubins(const jit2triton::Package& pkg, int64_t arch, c10::Device device) {
  py::gil_scoped_acquire gil;
  try {
    py::tuple made = py::module_::import("jit2triton.deploy.triton_kernels").attr("rebuilt_for_cpp")(
        kernel_sources(pkg), to_python(pkg.manifest.at("triton")), to_python(pkg.manifest.at("kernels")), arch,
        device.index());
    jit2triton::RebuiltCubins out;
    out.section = jit2triton::json::parse(made[0].cast<std::string>());
    for (auto item : made[1].cast<py::dict>()) out.cubins[item.first.cast<std::string>()] = item.second.cast<std::string>();
    return out;
  } catch (py::error_already_set& err) {
    rethrow(err, "rebuilding the GPU kernels for this GPU");
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  jit2triton::set_interpreted_kernels(&interpreted_kernels);
  jit2triton::set_library_rebuilder(&rebuilt_library);
  jit2triton::set_cubin_rebuilder(&rebuilt_cubins);

  // C++ errors become jit2triton's exception classes, with the same messages.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& err) {
      py::object errors = py::module_::import("jit2triton.deploy.cpp_runtime").attr("EXCEPTIONS");
      py::object cls = errors[py::str(error_class(err.kind()))];
      PyErr_SetObject(cls.ptr(), text(err.what()).ptr());
    }
  });

  // module-local: two builds of the runtime in one process (another jit2triton's, a benchmark's before and after)
  // each keep their own class, which pybind11 would otherwise refuse to register twice
  py::class_<jit2triton::Module>(m, "Module", py::module_local())
      .def(py::init([](const std::string& path, const std::string& device, int num_threads, bool cuda_graphs,
                       bool alias_outputs, bool mmap, std::vector<std::string> trusted_keys) {
             jit2triton::LoadOptions options;
             options.mmap = mmap;
             options.trusted_keys = std::move(trusted_keys);  // (Python joined JIT2TRITON_TRUSTED_KEYS's)
             options.keys_from_environment = false;
             options.device = device;
             options.num_threads = num_threads;
             options.cuda_graphs = cuda_graphs;
             options.alias_outputs = alias_outputs;
             py::gil_scoped_release released;
             return jit2triton::load(path, options);
           }),
           py::arg("path"), py::arg("device") = "", py::arg("num_threads") = 0, py::arg("cuda_graphs") = true,
           py::arg("alias_outputs") = false, py::arg("mmap") = false,
           py::arg("trusted_keys") = std::vector<std::string>())
      .def("__call__",
           [](const jit2triton::Module& self, py::args args) {
             std::vector<c10::IValue> inputs;
             inputs.reserve(args.size());
             for (size_t i = 0; i < args.size(); ++i) inputs.push_back(to_ivalue(args[i], i));
             c10::IValue out;
             // the model's warnings.warn (TORCH_WARN in the plan) become Python warnings when the call returns
             torch::PyWarningHandler warnings;
             try {
               py::gil_scoped_release released;
               out = self.call(inputs);
             } catch (...) {
               warnings.set_in_exception();
               throw;
             }
             return torch::jit::toPyObject(std::move(out));
           })
      .def("check_inputs",  // a call's inputs checked, defaults filled: serving's per-request check
           [](const jit2triton::Module& self, py::list args) {
             std::vector<c10::IValue> inputs;
             for (size_t i = 0; i < args.size(); ++i) inputs.push_back(to_ivalue(args[i], i));
             py::list out;
             for (auto& v : self.check_inputs(inputs)) out.append(torch::jit::toPyObject(std::move(v)));
             return out;
           })
      .def("method", &jit2triton::Module::method)
      .def("method_names", &jit2triton::Module::method_names)
      .def_property_readonly("device", &jit2triton::Module::device)
      .def_property_readonly("uses_cuda_graph", &jit2triton::Module::uses_cuda_graph)
      .def("members",  // all but weights.bin, whose tensors weights() gives without a copy
           [](const jit2triton::Module& self) {
             py::dict out;
             for (const auto& [name, data] : self.members())
               if (name != "weights.bin") out[text(name)] = py::bytes(data.data(), data.size());
             return out;
           })
      .def("member",  // one member's bytes (None if absent), without copying the others as members() does
           [](const jit2triton::Module& self, const std::string& name) -> py::object {
             auto members = self.members();
             auto found = members.find(name);
             if (found == members.end()) return py::none();
             return py::bytes(found->second.data(), found->second.size());
           })
      .def("weights",
           [](const jit2triton::Module& self) {
             py::dict out;
             for (const auto& [name, weight] : self.weights()) out[text(name)] = py::cast(weight);
             return out;
           })
      .def("signature", &jit2triton::Module::signature)
      .def("attribute_names", &jit2triton::Module::attribute_names)
      .def("attribute", [](const jit2triton::Module& self, const std::string& name) {
        return torch::jit::toPyObject(self.attribute(name));
      })
      .def("observe",  // [(node, (tensor or None, ...))] in the order made: conversion's culprit search
           [](const jit2triton::Module& self, py::list args, int per_node) {
             std::vector<c10::IValue> inputs;
             for (size_t i = 0; i < args.size(); ++i) inputs.push_back(to_ivalue(args[i], i));
             std::vector<jit2triton::StepOutputs> seen;
             {
               py::gil_scoped_release released;
               seen = self.observe(inputs, per_node);
             }
             py::list out;
             for (auto& step : seen) {
               py::list values;
               for (auto& v : step.outputs) values.append(torch::jit::toPyObject(std::move(v)));
               out.append(py::make_tuple(step.node, py::tuple(values)));
             }
             return out;
           })
      .def("set_profiling", &jit2triton::Module::set_profiling, py::arg("on"), py::arg("host_only") = false)
      .def("step_times", [](const jit2triton::Module& self) {
        py::list out;  // (node, op, source, seconds, runs) per step that ran
        for (const auto& t : self.step_times())
          out.append(py::make_tuple(t.node, text(t.op), text(t.source), t.seconds, t.runs));
        return out;
      });
  // Which keys the CUDA graph places go to over a sequence of calls (graph_admission.h), for the CPU tests: (the
  // keys captured in order, the keys holding graphs at the end).
  m.def("graph_admission", [](const std::vector<std::string>& calls, size_t max_graphs, int64_t age_calls) {
    jit2triton::Admission admission(max_graphs, age_calls);
    std::map<std::string, bool> graphs;
    std::vector<std::string> captures;
    for (const auto& key : calls) {
      admission.sighted(key);
      if (!graphs.count(key) && admission.admit(key, graphs)) {
        admission.make_room(graphs);
        graphs[key] = true;
        captures.push_back(key);
      }
    }
    std::vector<std::string> held;
    for (const auto& [key, _] : graphs) held.push_back(key);
    return std::make_pair(captures, held);
  });
}
