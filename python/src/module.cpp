// loom._loom: the extension module. C++ errors become Python exceptions by kind: loom::Error (a bad
// shape, value or file format) -> ValueError, loom::IoError -> OSError, loom::InternalError and other
// std exceptions -> RuntimeError (nanobind's default for std::exception).
#include "convert.h"

NB_MODULE(_loom, m) {
  namespace nb = nanobind;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const loom::IoError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    } catch (const loom::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const loom::InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  loom::python::bind_ops(m);
  loom::python::bind_models(m);
  loom::python::bind_train(m);
  loom::python::bind_tokenizer(m);
  loom::python::bind_dist(m);
}
