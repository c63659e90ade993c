"""The built-in end-to-end run: `regroup demo` (warm up the tiny model, train every recipe, evaluate, report).
It uses the library; the library never imports it. The studies live beside the package, in studies/."""
