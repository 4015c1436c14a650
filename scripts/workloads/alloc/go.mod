module gostw.test/alloc

go 1.19
