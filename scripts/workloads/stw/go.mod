module gostw.test/stw

go 1.19
